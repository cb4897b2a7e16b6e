"""Results store: ingest, clock alignment, energy integration, external meter traces, metrics."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timezone

import numpy as np
import pytest

from edgebench.figures.run_meta import RunMeta
from edgebench.results.alignment import fit_probes
from edgebench.results.energy import window_energy_j
from edgebench.results.external import CsvMapping
from edgebench.results.metrics import all_metrics, forward_fill, step_energy_j
from edgebench.results.pareto import frontier_indices
from edgebench.results.store import Store
from edgebench.untrusted import BadRecord
from results_fixtures import FakeRun, probes_for

HOST_EPOCH_NS = 1_790_000_000_000_000_000


def test_alignment_recovers_offset_and_drift_and_drops_slow_probes():
    rng = np.random.default_rng(1)
    run = FakeRun()
    offset, drift, ref = HOST_EPOCH_NS - run.mono0_ns, 80e-6, run.mono0_ns  # 80 ppm: 288 ms per hour
    times = np.sort(rng.uniform(0, 3600, 40)).tolist()
    fast = rng.uniform(0.8, 2.5, 40)
    slow = rng.random(40) < 0.3
    rtts = np.where(slow, rng.uniform(150, 900, 40), fast).tolist()
    asym = np.where(slow, 0.95, rng.uniform(0.3, 0.7, 40)).tolist()  # slow trips are also lopsided
    probes = probes_for(run, offset, drift, ref, times, rtts, asym)
    meta = RunMeta.from_json(run.meta(), "meta.json")

    a = fit_probes(probes, meta=meta)
    assert a.source == "probes" and a.probes_discarded == int(slow.sum()) and a.probes_used == 40 - int(slow.sum())
    mono = run.mono0_ns + np.linspace(0, 3600e9, 50).astype(np.int64)
    truth = mono + offset + np.rint(drift * (mono - ref)).astype(np.int64)
    assert np.abs(a.to_host_ns(mono) - truth).max() < 1_000_000
    assert abs(a.drift - drift) < 1e-6

    keep_all = fit_probes(probes, rtt_factor=1e9, meta=meta)  # the same fit without discarding
    assert np.abs(keep_all.to_host_ns(mono) - truth).max() > 5_000_000


def test_alignment_ignores_probes_from_another_boot_and_falls_back_to_meta(tmp_path):
    run = FakeRun()
    other_boot = probes_for(FakeRun(boot_wall_ns=run.boot_wall_ns + 86_400 * 10**9), 10**9, 0.0, 0, [0, 1], [1, 1])
    assert fit_probes(other_boot, meta=RunMeta.from_json(run.meta(), "meta.json")) is None
    with Store(tmp_path / "s.duckdb") as store:
        store.ingest_run(run.write(tmp_path / "src"), device="pi")
        store.add_clock_probes("pi", other_boot)
        a = store.alignment("pi", run.run_id)
        assert a.source == "meta" and "meta.json" in a.note
        assert a.to_host_ns(run.mono0_ns) == run.mono0_ns + run.boot_wall_ns


def test_window_energy_is_the_exact_integral_of_a_piecewise_linear_trace():
    rng = np.random.default_rng(2)
    t = np.sort(rng.choice(np.arange(0, 10_000_000_000, 1000), 300, replace=False)).astype(np.int64)
    p = rng.uniform(1, 9, len(t))
    begin = np.sort(rng.integers(t[0], t[-1] - 2_000_000_000, 30))
    end = begin + rng.integers(1, 2_000_000_000, 30)
    got = window_energy_j(t, p, begin, end)
    for b, e, g in zip(begin, end, got):  # exact: trapezoids over the breakpoints inside plus both edges
        xs = np.concatenate([[b], t[(t > b) & (t < e)], [e]])
        ys = np.interp(xs, t, p)
        assert g == pytest.approx(float(np.sum(np.diff(xs) * (ys[1:] + ys[:-1]) / 2)) / 1e9, rel=1e-9)
    outside = window_energy_j(t, p, np.array([t[0] - 1]), np.array([t[5]]))
    assert np.isnan(outside[0])


def test_energy_per_step_from_the_device_trace_matches_the_analytic_integral(tmp_path):
    run = FakeRun(power=lambda t_s: 2.0 + 0.5 * t_s, sample_hz=7.0, power_est=lambda t_s: 4.0 + 0 * t_s)
    with Store(tmp_path / "s.duckdb") as store:
        store.ingest_run(run.write(tmp_path / "src"), device="pi")
        m = all_metrics(store)[0]
    windows = [
        ((b - run.mono0_ns) / 1e9, (e - run.mono0_ns) / 1e9) for ph, _, b, e in run.step_windows_ns() if ph == "measure"
    ]
    exact = np.mean([2.0 * (e - b) + 0.25 * (e * e - b * b) for b, e in windows])
    assert m["energy_per_step_j"] == pytest.approx(exact, rel=1e-9)
    assert m["energy_per_sample_j"] == pytest.approx(exact / run.batch_size, rel=1e-9)
    assert m["energy_source"] == "device"
    assert m["energy_per_step_j_est"] == pytest.approx(4.0 * run.step_s, rel=1e-9)
    assert m["power_mean_w_est"] == pytest.approx(4.0) and m["power_mean_w"] != pytest.approx(4.0)


def _write_meter_csv(path, times_ns, watts):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["Timestamp", "Voltage(mV)", "Current(mA)"])
        for t, p in zip(times_ns, watts):
            stamp = datetime.fromtimestamp(t // 1000 / 1e6, tz=timezone.utc).replace(tzinfo=None)
            w.writerow([stamp.isoformat(timespec="microseconds"), "5000", f"{p / 5 * 1000:.6f}"])


def test_external_csv_with_a_known_offset_lands_on_the_right_steps(tmp_path):
    run = FakeRun(power=None, steps=12, step_s=0.5)
    offset = HOST_EPOCH_NS - run.mono0_ns
    probes = probes_for(run, offset, 0.0, run.mono0_ns, [0, 2, 4, 6, 8], [1, 1, 1, 1, 1])
    meter_ahead_s = 2.75  # the meter's clock runs 2.75 s ahead of the host
    # Power high in odd measured steps, low in even ones, switching exactly at step edges (host time).
    times, watts = [], []
    windows = [(s, b, e) for ph, s, b, e in run.step_windows_ns() if ph == "measure"]
    for step, b, e in windows:
        level = 10.0 if step % 2 else 2.0
        for t in (b, e - 1000):
            times.append(b + offset if t == b else e + offset - 1000)
            watts.append(level)
    first, last = run.step_windows_ns()[0][2] + offset - 10**9, run.end_ns() + offset + 10**9
    times = [first] + times + [last]
    watts = [1.0] + watts + [1.0]
    meter_times = [t + int(meter_ahead_s * 1e9) for t in times]
    _write_meter_csv(tmp_path / "um34c.csv", meter_times, watts)

    with Store(tmp_path / "s.duckdb") as store:
        store.ingest_run(run.write(tmp_path / "src"), device="pi")
        store.add_clock_probes("pi", probes)
        mapping = CsvMapping(time_col="Timestamp", time_format="iso", voltage_col="Voltage(mV)", voltage_unit="mV",
                             current_col="Current(mA)", current_unit="mA", offset_s=meter_ahead_s)
        trace_id = store.import_external_trace(tmp_path / "um34c.csv", "pi", mapping)
        steps, energy, source = step_energy_j(store, "pi", run.run_id)
        m = all_metrics(store)[0]
    assert source == f"external:{trace_id}" and m["energy_source"] == source
    measured = steps["phase"] == "measure"
    expected = np.array([(10.0 if s % 2 else 2.0) * run.step_s for s in steps["step"][measured]])
    np.testing.assert_allclose(energy[measured], expected, rtol=1e-4)
    assert m["power_peak_w"] == pytest.approx(10.0)


def test_ingest_is_idempotent_and_counts_bad_lines(tmp_path):
    run = FakeRun()
    src = run.write(tmp_path / "src", garbage=True)
    with Store(tmp_path / "s.duckdb") as store:
        assert store.ingest_run(src, device="pi") == run.run_id
        counts = [store.con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in ("runs", "samples", "steps")]
        store.ingest_run(src, device="pi")
        again = [store.con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in ("runs", "samples", "steps")]
        assert counts == again == [1, len(run.sample_times_ns()), run.steps + run.warmup_steps]
        row = store.runs()[0]
        assert row["samples_bad_lines"] == 1 and row["samples_truncated"] is True
        assert (tmp_path / "raw").exists() is False  # the run lives beside the store: kept in place
        longer = FakeRun(steps=15)
        longer.write(tmp_path / "src")  # the same run re-collected after more steps replaces the old rows
        store.ingest_run(src, device="pi")
        assert store.con.execute("SELECT count(*) FROM steps").fetchall()[0][0] == 16
        store.ingest_run(src, device="jetson")  # same run id on another device: a separate run
        assert len(store.runs()) == 2


def test_raw_traces_are_copied_beside_the_store_and_new_sample_fields_add_columns(tmp_path):
    store_dir = tmp_path / "store"
    with Store(store_dir / "edgebench.duckdb") as store:
        store.ingest_run(FakeRun(run_id="a").write(tmp_path / "elsewhere"), device="pi")
        store.ingest_run(FakeRun(run_id="b", extra_fields={"rail_vdd_in_w": 4.5, "temp_cpu_c": 51.0}).write(
            tmp_path / "elsewhere"), device="pi")
        assert (store_dir / "raw" / "pi" / "b" / "samples.jsonl").exists()
        assert {"rail_vdd_in_w", "temp_cpu_c"} <= set(store.sample_columns())
        assert np.isnan(store.samples("pi", "a", ["rail_vdd_in_w"])["rail_vdd_in_w"]).all()
        assert (store.samples("pi", "b", ["rail_vdd_in_w"])["rail_vdd_in_w"] == 4.5).all()


def test_metrics_memory_time_throttle_loss_and_frontier(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        for i, (rss_mib, step_s) in enumerate([(300, 0.2), (200, 0.3), (320, 0.25), (150, 0.5)]):
            run = FakeRun(run_id=f"r{i}", rss_base=rss_mib << 20, step_s=step_s, throttle_after_s=1.0,
                          status="ok" if i < 3 else "oom")
            store.ingest_run(run.write(tmp_path / "src"), device="pi")
        rows = {r["run_id"]: r for r in all_metrics(store)}
    assert [rows[f"r{i}"]["on_frontier"] for i in range(4)] == [True, True, False, None]
    r0 = rows["r0"]
    assert r0["step_time_median_s"] == pytest.approx(0.2) and r0["samples_per_s"] == pytest.approx(2 / 0.2)
    assert r0["tokens_per_s"] == pytest.approx(16 * 2 / 0.2)
    assert r0["peak_rss_bytes_sampled"] == (300 << 20) + 11 * (1 << 20)
    assert r0["loss_first"] == pytest.approx(10.0) and r0["loss_last"] == pytest.approx(10.0 * 0.9 ** 10)
    run0 = FakeRun(step_s=0.2)
    span_s = (run0.end_ns() - run0.mono0_ns) / 1e9
    assert r0["time_throttled_s"] == pytest.approx(span_s - 1.0, abs=0.03)
    assert r0["temp_peak_c"] == pytest.approx(45 + span_s, abs=0.03)
    assert frontier_indices([(1, 5), (2, 4), (2, 6), (3, 4)]) == {0, 1}
    np.testing.assert_array_equal(forward_fill(np.array([np.nan, 1, np.nan, 0, np.nan])), [np.nan, 1, 1, 0, 0])


def test_ingest_and_import_trace_commands(tmp_path):
    from click.testing import CliRunner

    from edgebench.results.commands import import_trace_command, ingest_command

    run_dir = FakeRun().write(tmp_path / "src", garbage=True)
    store_path = tmp_path / "s.duckdb"
    out = CliRunner().invoke(ingest_command, [str(run_dir), "--device", "pi", "--store", str(store_path), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)[0] | {"samples_bad_lines": 1, "samples_truncated": True} == json.loads(out.output)[0]
    (tmp_path / "plug.csv").write_text("when;mw\n1790000000000;2500\n1790000000500;3500\n1790000001000;\n")
    out = CliRunner().invoke(import_trace_command, [
        str(tmp_path / "plug.csv"), "--device", "pi", "--store", str(store_path), "--time-col", "when",
        "--time-format", "ms", "--power-col", "mw", "--power-unit", "mW", "--delimiter", ";", "--offset-s", "1"])
    assert out.exit_code == 0, out.output
    with Store(store_path) as store:
        t, p = store.external_arrays("pi:plug")
    np.testing.assert_array_equal(t, [1_789_999_999_000_000_000, 1_789_999_999_500_000_000])
    np.testing.assert_allclose(p, [2.5, 3.5])
    bad = CliRunner().invoke(import_trace_command, [str(tmp_path / "plug.csv"), "--device", "pi", "--store",
                                                    str(store_path), "--power-col", "watts"])
    assert bad.exit_code != 0 and "no column(s)" in bad.output and "the header has" in bad.output


def test_one_definition_of_each_step_figure_in_result_json_store_and_bench(tmp_path):
    """result.json (the supervisor), the store's metrics and bench's table agree on median,
    p90 and samples/s for the same steps (edgebench.runner.figures)."""
    from edgebench.figures.run_events import events_of
    from edgebench.figures.steps import percentile, step_statistics, step_time_stats
    from edgebench.report.tables import bench_rows

    durations = [0.1, 0.5, 0.2, 0.9, 0.3, 0.25, 0.7]
    run = FakeRun(steps=len(durations))
    run_dir = run.write(tmp_path / "src")
    events, t = [], run.mono0_ns
    for i, d in enumerate([0.1] + durations):
        phase, step = ("warmup", 0) if i == 0 else ("measure", i - 1)
        end = t + int(d * 1e9)
        events += [{"t_ns": t, "event": "step_begin", "step": step, "phase": phase},
                   {"t_ns": end, "event": "step_end", "step": step, "phase": phase, "loss": 1.0, "duration_s": d}]
        t = end
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    stats = step_statistics(events_of(events, "events"))["step_time_s"]
    with Store(tmp_path / "s.duckdb") as store:
        store.ingest_run(run_dir, device="pi")
        row = all_metrics(store)[0]
    assert stats["median"] == pytest.approx(np.median(durations)) == row["step_time_median_s"]
    assert stats["p90"] == pytest.approx(np.percentile(durations, 90)) == pytest.approx(row["step_time_p90_s"])
    assert row["samples_per_s"] == pytest.approx(run.batch_size / np.median(durations))
    bench = bench_rows([{"method": "adamw", "status": "ok", "step_time_s": stats,
                         "samples_per_s": run.batch_size / stats["median"]}])[0]
    assert bench["samples_per_s"] == pytest.approx(row["samples_per_s"])
    for q in (0, 10, 50, 90, 100):
        assert percentile(durations, q) == pytest.approx(np.percentile(durations, q))
    assert step_time_stats([]) is None


def _proc(root, busy_ticks, steal_ticks, load):
    proc = root / "proc"
    proc.mkdir(parents=True, exist_ok=True)
    idle = 100_000
    (proc / "stat").write_text(f"cpu  {busy_ticks} 0 0 {idle} 0 0 0 {steal_ticks} 0 0\n"
                               "cpu0 1 0 0 1 0 0 0 0 0 0\ncpu1 1 0 0 1 0 0 0 0 0 0\nintr 1\n")
    (proc / "loadavg").write_text(f"{load} 1.00 1.00 2/300 4242\n")


@pytest.mark.parametrize("others_ticks, steal_ticks, disturbed", [(100, 0, False), (800, 0, True), (0, 500, True)])
def test_noise_guard_counts_others_cpu_and_steal(tmp_path, others_ticks, steal_ticks, disturbed):
    from edgebench.figures.cpu import cpu_share
    from edgebench.telemetry.contention import cpu_snapshot

    clock_ticks = 100
    _proc(tmp_path, 1000, 0, 0.5)
    before = cpu_snapshot(tmp_path)
    run_ticks = 200
    _proc(tmp_path, 1000 + run_ticks + others_ticks, steal_ticks, 3.5)
    after = cpu_snapshot(tmp_path)
    before.update(t_ns=0, run_cpu_s=1.0)
    after.update(t_ns=10_000_000_000, run_cpu_s=1.0 + run_ticks / clock_ticks)
    got = cpu_share(before, after, clock_ticks)
    shell = cpu_share({**before, "run_cpu_s": None, "times": "0m0.50s 0m0.25s\n0m0.20s 0m0.05s\n"},
                      {**after, "run_cpu_s": None, "times": "0m0.50s 0m0.25s\n0m2.20s 0m0.05s\n"}, clock_ticks)
    assert shell == got  # the shell's `times` gives the run's CPU as getrusage does
    capacity = 10.0 * 2  # wall x the two cores /proc/stat lists
    assert got["others_share"] == pytest.approx(others_ticks / clock_ticks / capacity, abs=1e-4)
    assert got["steal_share"] == pytest.approx(steal_ticks / clock_ticks / capacity, abs=1e-4)
    assert got["load_1m"] == 3.5 and got["disturbed"] is disturbed
    assert (got["disturbed_why"] is None) is (not disturbed)
    blind = cpu_share(cpu_snapshot(tmp_path / "nothing"), cpu_snapshot(tmp_path / "nothing"))
    assert blind["disturbed"] is None  # no /proc/stat: the guard says it cannot tell


def test_ingest_reads_keys_that_first_appear_late_and_refuses_nested_values(tmp_path):
    """DuckDB's type detection samples the first lines only: a field first seen later still
    arrives (as a number, as text); a nested value is no reading (figures.run_samples) and
    refuses the run, naming its line, however late it comes."""
    run = FakeRun()
    run_dir = run.write(tmp_path / "src")
    lines = (run_dir / "samples.jsonl").read_text().splitlines()
    filler = [json.dumps({"t_ns": 1, "rss_bytes": 1}) for _ in range(25_000)]  # past the detection sample
    late = json.loads(lines[-1]) | {"gpu_mem_bytes": 123, "note": "x"}
    (run_dir / "samples.jsonl").write_text("\n".join(filler + lines[:-1] + [json.dumps(late)]) + "\n")
    with Store(tmp_path / "s.duckdb") as store:
        store.ingest_run(run_dir, device="pi")
        got = store.con.execute("SELECT gpu_mem_bytes, note FROM samples WHERE gpu_mem_bytes IS NOT NULL").fetchall()
        types = dict(store.con.execute("SELECT column_name, data_type FROM information_schema.columns "
                                       "WHERE table_name = 'samples'").fetchall())
        assert got == [(123, "x")]
        assert types["gpu_mem_bytes"] == "BIGINT" and types["note"] == "VARCHAR"
        nested = late | {"rails": {"vdd_in": 4.5}}
        (run_dir / "samples.jsonl").write_text("\n".join(filler + lines[:-1] + [json.dumps(nested)]) + "\n")
        with pytest.raises(BadRecord, match=f"samples.jsonl line {len(filler) + len(lines)}: sample.rails is "
                                            "{'vdd_in': 4.5}, not null, true, false, a finite number or text"):
            store.ingest_run(run_dir, device="pi")
        assert store.con.execute("SELECT count(*) FROM samples WHERE gpu_mem_bytes = 123").fetchone() == (1,)


def test_events_read_by_duckdb_count_bad_lines_and_rebuild_steps(tmp_path):
    """events.jsonl as a killed or damaged runner leaves it: a garbage line, a step_end whose
    begin line was lost (its begin comes from duration_s), a step that never ended, an
    error event, a truncated last line."""
    run = FakeRun(steps=3)
    run_dir = run.write(tmp_path / "src")
    events = run.events()
    lost = next(i for i, e in enumerate(events) if e["event"] == "step_begin" and e["phase"] == "measure")
    lines = [json.dumps(e) for i, e in enumerate(events) if i != lost]
    last_end = events[-1]["t_ns"]
    lines += ["not json", json.dumps({"t_ns": last_end + 10, "event": "step_begin", "step": 3, "phase": "measure"}),
              json.dumps({"t_ns": last_end + 20, "event": "error", "detail": "worker died: SIGKILL"})]
    (run_dir / "events.jsonl").write_text("\n".join(lines) + '\n{"t_ns": 9, "ev')
    with Store(tmp_path / "s.duckdb") as store:
        store.ingest_run(run_dir, device="pi")
        row = store.runs()[0]
        steps = store.steps("pi", run.run_id)
        unended = store.con.execute("SELECT begin_ns, end_ns FROM steps WHERE step = 3").fetchall()
    assert (row["events_bad_lines"], row["events_truncated"]) == (1, True)
    assert row["detail"] == "worker died: SIGKILL"
    windows = {(p, s): (b, e) for p, s, b, e in run.step_windows_ns()}
    got = {(p, int(s)): (b, e) for p, s, b, e in zip(steps["phase"], steps["step"], steps["begin_ns"], steps["end_ns"])}
    assert got[("measure", 0)] == windows[("measure", 0)]  # begin = end - duration_s
    assert got[("warmup", 0)] == windows[("warmup", 0)] and got[("measure", 2)] == windows[("measure", 2)]
    assert len(got) == run.warmup_steps + run.steps and unended == [(last_end + 10, None)]


def _downgrade_to_text_keys(path):
    """Rewrites a store to the layout before run keys (device and run_id on every sample and step row)."""
    import duckdb

    con = duckdb.connect(str(path))
    con.execute("DROP VIEW samples_host; DROP VIEW steps_host")
    for table in ("samples", "steps"):
        con.execute(f"CREATE TABLE old AS SELECT r.device, r.run_id, t.* EXCLUDE (run_key) FROM {table} t "
                    "JOIN runs r USING (run_key)")
        con.execute(f"DROP TABLE {table}; ALTER TABLE old RENAME TO {table}")
    con.execute("CREATE TABLE old AS SELECT * EXCLUDE (run_key, packing) FROM runs; DROP TABLE runs; "
                "ALTER TABLE old RENAME TO runs")
    con.close()


def test_sample_rows_carry_only_a_run_key_and_older_stores_upgrade_in_place(tmp_path):
    a, b = FakeRun(run_id="run-a"), FakeRun(run_id="run-b")
    src_a, src_b = a.write(tmp_path / "src"), b.write(tmp_path / "src")
    meta = json.loads((src_b / "meta.json").read_text())
    meta["spec"]["packing"] = True
    (src_b / "meta.json").write_text(json.dumps(meta))
    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        store.ingest_run(src_a, device="pi")
        store.ingest_run(src_b, device="pi")
        assert {"device", "run_id"}.isdisjoint(store.sample_columns()) and "run_key" in store.sample_columns()
        keys = {r["run_id"]: (r["run_key"], r["packing"]) for r in store.runs()}
        assert keys == {"run-a": (1, False), "run-b": (2, True)}
        store.ingest_run(src_a, device="pi")  # a re-ingest keeps the run's key
        assert {r["run_id"]: r["run_key"] for r in store.runs()} == {"run-a": 1, "run-b": 2}
        before = store.samples("pi", "run-b", ["rss_bytes"])
        host = store.con.execute(
            "SELECT device, run_id, count(*) FROM samples_host GROUP BY ALL ORDER BY run_id"
        ).fetchall()
        assert host == [("pi", "run-a", len(a.sample_times_ns())), ("pi", "run-b", len(b.sample_times_ns()))]
    _downgrade_to_text_keys(path)
    with Store(path, read_only=True) as store:  # an older store: upgraded on open, nothing lost
        assert {r["run_id"]: r["packing"] for r in store.runs()} == {"run-a": False, "run-b": True}
        after = store.samples("pi", "run-b", ["rss_bytes"])
        np.testing.assert_array_equal(after["t_ns"], before["t_ns"])
        np.testing.assert_array_equal(after["rss_bytes"], before["rss_bytes"])
        assert len(store.steps("pi", "run-a")["step"]) == a.steps + a.warmup_steps
        assert "device" not in store.sample_columns()


def test_a_counter_rate_wraps_where_its_maximum_is_known_and_has_no_rate_where_it_falls():
    from edgebench.figures.counters import counter_rate

    t = np.array([0, 1, 2, 3, 4], dtype=np.int64) * 10**9
    counter = np.array([10.0, 30.0, np.nan, 5.0, 25.0])  # a missed reading, then a fall from 30 to 5
    rate, falls = counter_rate(t, counter)
    np.testing.assert_array_equal(rate, [np.nan, 20.0, np.nan, np.nan, 20.0])
    assert falls == 1
    wrapped, falls = counter_rate(t, counter, wraps_at=40.0)  # 30 -> 40 = 0 -> 5 over two seconds
    np.testing.assert_array_equal(wrapped, [np.nan, 20.0, np.nan, 7.5, 20.0])
    assert falls == 0


def test_a_fetched_text_column_reads_none_for_null_not_a_fill_character():
    """The store's columns come back as plain arrays: a null number NaN, a null text None
    (numpy's masked fill for text is '?')."""
    import duckdb

    from edgebench.results.store import _plain

    got = duckdb.connect().execute("SELECT * FROM (VALUES ('a', 1), (NULL, NULL)) t(text, number)").fetchnumpy()
    assert _plain(got["text"]).tolist() == ["a", None]
    assert _plain(got["number"])[0] == 1 and np.isnan(_plain(got["number"])[1])
