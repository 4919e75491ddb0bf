"""Tidy tables of a study for pandas users: trials (one row per trial, params as `param.<name>` columns),
levels (one row per trial x workload x level, SGLang metric names as columns) and crashes."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from tunectl.reports.data import StudyData, peak_level

from tunectl.energy import level_energy
from tunectl.store import level_metrics

FORMATS = ("csv", "parquet")


def frames(data: StudyData) -> dict[str, pd.DataFrame]:
    trows: list[dict[str, Any]] = []
    lrows: list[dict[str, Any]] = []
    crows: list[dict[str, Any]] = []
    for t in sorted(data.trials, key=lambda t: t.trial):
        peak = peak_level(t)
        trows.append({"study": data.name, "trial": t.trial, "role": t.role, "status": t.status,
                      "attempt": t.attempt, "output_throughput": t.best_output_throughput,
                      "peak_concurrency": peak.concurrency if peak else None,
                      "max_stable_concurrency": t.max_stable_concurrency,
                      "crash_class": t.crash.cls if t.crash else None, "crashed_level": t.crashed_level,
                      "ready_s": t.ready_s, "wall_s": t.wall_s, "host": t.host, "machine": t.machine or None,
                      "sglang_version": t.sglang_version, **level_energy(peak),   # at the peak level
                      **{f"param.{k}": v for k, v in t.params.items()}})
        for lv in t.levels:
            lrows.append({**level_metrics(lv), "study": data.name, "trial": t.trial, "workload": lv.workload,
                          "concurrency": lv.concurrency, "status": lv.status, "completed": lv.completed,
                          "failed_requests": lv.failed_requests, "duration_s": lv.duration_s,
                          "client_bound": lv.client_bound})
        if t.crash is not None:
            c = t.crash
            crows.append({"study": data.name, "trial": t.trial, "class": c.cls, "signature": c.signature,
                          "phase": c.phase, "level": c.level, "exception_line": c.exception_line,
                          "exit_code": c.exit_code, "detect_latency_s": c.detect_latency_s})
    return {"trials": _frame(trows), "levels": _frame(lrows),
            "crashes": _frame(crows, ["study", "trial", "class", "signature", "phase", "level", "exception_line",
                                      "exit_code", "detect_latency_s"])}


def _frame(rows: list[dict[str, Any]], columns: list[str] | None = None) -> pd.DataFrame:
    """A table whose integer columns stay integers where some rows have none (a trial without a peak level, a
    knob a trial did not set): pandas' nullable Int64, written as 64 (not 64.0) in CSV and as int64 in Parquet."""
    df = _typed(pd.DataFrame(rows, columns=columns))
    for col in df.columns:
        values = [r[col] for r in rows if r.get(col) is not None]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            df[col] = pd.array([r.get(col) for r in rows], dtype="Int64")
    return df


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    """Parquet needs one type per column: a column mixing kinds (a knob that is a number in one trial and a
    word in another) becomes text; a knob a trial did not set is None."""
    for col in df.columns:
        if df[col].dtype == object:
            df[col] = df[col].astype(object).where(df[col].notna(), None)   # one missing marker: None
            kinds = {type(v) for v in df[col].dropna()}
            if len(kinds) > 1:
                df[col] = df[col].map(lambda v: None if v is None else str(v))
    return df


def write(data: StudyData, out_dir: Path, fmt: str = "csv") -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, df in frames(data).items():
        path = out_dir / f"{data.name}-{name}.{fmt}"
        if fmt == "csv":
            df.to_csv(path, index=False)
        else:
            df.to_parquet(path, index=False)
        paths.append(path)
    return paths
