"""Stand-alone programs the host runs on a device with `python -c SOURCE`, before (or
without) edgebench being there: standard library only, one JSON object printed. They are
real modules so linters and tests see them as code; `fleet.remote.run_program` sends their source.
"""
