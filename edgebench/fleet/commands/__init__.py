"""The fleet's commands, one module each: `edgebench bench`, `measure`, `deploy`, `collect`, `status` and
`devices calibrate`. Each checks its options (fleet/options.py, fleet/checks.py), calls the
fleet module that does the work (fleet/bench.py, measure.py, deploy.py, collect.py, status.py, calibrate.py)
and prints what came back; `edgebench/cli` registers them."""
