"""Trace readers: the real ITP files (read in place from ../shared), and the mapping for others."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuorch.simulate.mapping import load_mapping, parse_mapping
from gpuorch.simulate.trace import read_trace


def _itp() -> Path:
    """The ITP trace, read where it lies: `$GPUORCH_ITP_TRACE`, else `shared/data/traces/itp` beside
    the checkout or beside any folder above it (a CI clone may sit deeper), else /work/shared."""
    if os.environ.get("GPUORCH_ITP_TRACE"):
        return Path(os.environ["GPUORCH_ITP_TRACE"])
    tail = Path("shared") / "data" / "traces" / "itp"
    for up in Path(__file__).resolve().parents[2].parents:
        if (up / tail).is_dir():
            return up / tail
    return Path("/work") / tail


ITP = _itp()


def test_reads_the_first_rows_of_every_real_itp_file_merged_on_one_clock() -> None:
    jobs, stats = read_trace(ITP, limit=50)
    assert len(stats.files) == 10 and len(jobs) == 500 and stats.skipped == 0
    assert [j.submit for j in jobs] == sorted(j.submit for j in jobs) and jobs[0].submit == 0
    assert {j.origin for j in jobs} == {f"cluster{k:02d}" for k in range(1, 11)}
    # cluster02's first row, as the file has it: f60b9881-...,5010,1265,1 (the clock starts at 1999, c07's first job)
    first02 = next(j for j in jobs if j.origin == "cluster02")
    assert (first02.job_id, first02.submit, first02.duration, first02.gpus) == ("f60b9881-76f3-6fc7-d009-6b2a00419afc", 5010 - 1999, 1265, 1)
    assert all(j.duration > 0 and 1 <= j.gpus <= 64 for j in jobs)


def test_any_csv_of_the_itp_schema_and_bad_rows_are_counted(tmp_path: Path) -> None:
    f = tmp_path / "mine.csv"
    f.write_text("job_id,submission_time,duration,num_gpu\na,100,50,2\nb,90,0,1\nc,95,10,x\nd,120,30,8\n")
    jobs, stats = read_trace(f)
    assert [(j.job_id, j.submit, j.gpus) for j in jobs] == [("a", 0, 2), ("d", 20, 8)]
    assert stats.rows == 4 and stats.skipped == 2


def test_other_traces_map_onto_the_same_fields(tmp_path: Path) -> None:
    helios = tmp_path / "cluster_log.csv"
    helios.write_text("job_id,user,gpu_num,submit_time,duration,state\nh1,u,4,2020-04-01 00:00:00,3600,COMPLETED\n"
                      "h2,u,0,2020-04-01 00:10:00,60,COMPLETED\nh3,u,8,2020-04-01 01:00:00,120,FAILED\n")
    jobs, _ = read_trace(helios, "helios")
    assert [(j.job_id, j.submit, j.duration, j.gpus) for j in jobs] == [("h1", 0, 3600, 4), ("h3", 3600, 120, 8)]
    pai = tmp_path / "pai_task_table.csv"
    pai.write_text("job_name,task_name,plan_gpu,start_time,end_time\np1,w,50,1000,1600\np2,w,800,1100,1200\n")
    jobs, _ = read_trace(pai, load_mapping("pai"))
    assert [(j.job_id, j.submit, j.duration, j.gpus) for j in jobs] == [("p1", 0, 600, 1), ("p2", 100, 100, 8)]
    own = parse_mapping({"jobs": {"id": "id", "submit": "t", "duration": "d", "gpus": "g"}}, "own.yaml")
    (tmp_path / "own.csv").write_text("id,t,d,g\nx,5,10,1\n")
    assert read_trace(tmp_path / "own.csv", own)[0][0].gpus == 1


def test_a_file_of_another_schema_is_refused_with_the_missing_columns(tmp_path: Path) -> None:
    f = tmp_path / "x.csv"
    f.write_text("id,when,gpus\n1,2,3\n")
    with pytest.raises(ValueError, match="missing column"):
        read_trace(f)
