"""cgroup v2 detection, planning, dry-run recording and the delegated writer on a fake cgroupfs."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from services.common.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from services.nodeagent import cgroupfs


def fake_cgroupfs(root: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("")
    (root / "cgroup.procs").write_text("")
    return root


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_detect_reads_mountinfo_controllers_and_own_path(tmp_path: Path) -> None:
    mount = fake_cgroupfs(tmp_path / "unified")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:8 - cgroup cgroup rw,cpu\n"
        f"35 25 0:30 / {mount} rw,relatime shared:9 - cgroup2 cgroup2 rw\n"
    )
    proc_cgroup = tmp_path / "cgroup"
    proc_cgroup.write_text("1:cpu:/\n0::/user.slice/agent\n")
    delegated = fake_cgroupfs(tmp_path / "unified" / "delegated")
    found = cgroupfs.detect(str(delegated), mountinfo=mountinfo, proc_cgroup=proc_cgroup)
    assert found.unified and found.mount_point == str(mount)
    assert found.controllers == ("cpuset", "cpu", "io", "memory", "pids")
    assert found.own_path == "/user.slice/agent"
    assert found.delegated_writable


def test_detect_without_cgroup2(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("30 25 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n")
    found = cgroupfs.detect(mountinfo=mountinfo, proc_cgroup=tmp_path / "missing")
    assert not found.unified and found.controllers == () and "no cgroup2" in found.reason


def test_detect_this_machine_never_writes(tmp_path: Path) -> None:
    found = cgroupfs.detect()
    assert isinstance(found.unified, bool)


def test_planner_defaults_per_class_and_validates() -> None:
    batch = cgroupfs.plan_group("t1", "BATCH", cpuset_cpus="0-1")
    assert (batch.path, batch.cpu_weight, batch.cpu_max) == ("parfusion/t1", 20, "max")
    urgent = cgroupfs.plan_group("u1", "URGENT", cpu_max="50000 100000", pids=(7,))
    assert urgent.cpu_weight == 1000
    assert ("parfusion/u1/cgroup.procs", "7") in urgent.writes()
    for bad in (
        {"path": "../escape"},
        {"path": "/sys/fs/cgroup/x"},
        {"cpu_weight": 20000},
        {"cpu_max": "lots"},
    ):
        with pytest.raises(InvalidArgument):
            cgroupfs.plan_group("x", "ONLINE", **bad)  # type: ignore[arg-type]


def test_dry_run_records_json_and_touches_no_cgroup_file(tmp_path: Path) -> None:
    mount = fake_cgroupfs(tmp_path / "cgroup")
    before = snapshot(mount)
    detection = cgroupfs.detect(mount_override=mount)
    rec = cgroupfs.CgroupRecord(
        generation=5,
        mode="dry-run",
        detection=detection,
        groups=[cgroupfs.plan_group("w", "ONLINE", cpuset_cpus="0", pids=(11, 12))],
    )
    out = cgroupfs.record(rec, tmp_path / "run" / "nodeagent" / "cgroup-plan.json")
    doc = json.loads(out.read_text())
    assert doc["mode"] == "dry-run" and doc["generation"] == 5
    assert {"file": "parfusion/w/cpu.weight", "value": "400"} in doc["would_write"]
    assert snapshot(mount) == before


def _record_of(generation: int, mount: Path) -> cgroupfs.CgroupRecord:
    return cgroupfs.CgroupRecord(
        generation=generation,
        mode="dry-run",
        detection=cgroupfs.detect(mount_override=mount),
        groups=[cgroupfs.plan_group("w", "ONLINE", cpu_weight=100 + generation)],
    )


def test_the_plan_record_is_rewritten_at_most_every_interval(tmp_path: Path) -> None:
    """The first record is written at once; those within the interval wait, and the latest of
    them is what a flush (or the interval's end) writes; an older one never replaces a newer."""
    mount = fake_cgroupfs(tmp_path / "cgroup")
    path = tmp_path / "run" / "cgroup-plan.json"

    def on_disk() -> int:
        return int(json.loads(path.read_text())["generation"])

    slow = cgroupfs.PlanRecorder(path, every_s=3600.0)
    slow.record(_record_of(1, mount))
    assert on_disk() == 1
    slow.record(_record_of(2, mount))
    slow.record(_record_of(3, mount))
    assert on_disk() == 1  # waiting for the interval
    slow.flush()
    assert on_disk() == 3  # the latest waiting one; 2 is never written
    slow.record(_record_of(2, mount))  # an older plan's record, late
    slow.flush()
    assert on_disk() == 3
    slow.flush()  # nothing waiting: nothing written
    assert on_disk() == 3

    quick = cgroupfs.PlanRecorder(path, every_s=0.05)
    quick.record(_record_of(7, mount))
    quick.record(_record_of(8, mount))  # written by the recorder's thread when it is due
    for _ in range(500):
        if on_disk() == 8:
            break
        threading.Event().wait(0.01)
    assert on_disk() == 8
    quick.record(_record_of(9, mount))
    quick.close()  # what waits is written, and the writer thread ends
    assert on_disk() == 9
    slow.close()


def test_delegated_writer_writes_inside_and_attaches_only_owned(tmp_path: Path) -> None:
    root = fake_cgroupfs(tmp_path / "delegated")
    outside = fake_cgroupfs(tmp_path / "outside")
    outside_before = snapshot(outside)
    writer = cgroupfs.DelegatedWriter(root)
    group = cgroupfs.plan_group("w", "ONLINE", cpuset_cpus="0-1", pids=(101, 102))
    written = writer.apply(group, owned={101, 102, 103})
    assert ("parfusion/w/cpu.weight", "400") in written
    assert (root / "parfusion" / "w" / "cpu.weight").read_text() == "400"
    assert (root / "parfusion" / "w" / "cpuset.cpus").read_text() == "0-1"
    assert (root / "parfusion" / "w" / "cgroup.procs").read_text().split() == ["101", "102"]
    assert (root / "cgroup.subtree_control").read_text() == "+cpu +cpuset"
    with pytest.raises(PermissionDenied):
        writer.apply(cgroupfs.plan_group("x", "BATCH", pids=(999,)), owned={101})
    assert not (root / "parfusion" / "x").exists()
    evil = cgroupfs.GroupPlan(
        "e", "BATCH", path="../outside", cpu_weight=1, cpu_max="max", cpuset_cpus=""
    )
    with pytest.raises((PermissionDenied, InvalidArgument)):
        writer.apply(evil, owned=set())
    assert snapshot(outside) == outside_before


def test_delegated_writer_needs_a_cgroup_directory(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition):
        cgroupfs.DelegatedWriter(tmp_path)


@pytest.mark.integration
def test_default_real_backend_never_writes_sys_fs_cgroup(home: Path, tmp_path: Path) -> None:
    """Default (dry-run) mode: a plan is recorded under run/, the cgroup tree is untouched."""
    from parfusion.v1 import intent_pb2
    from services.nodeagent.backend import BackendOptions
    from services.nodeagent.real import RealBackend

    mount = fake_cgroupfs(tmp_path / "cgroupfs")
    before = snapshot(mount)
    sys_before = (
        {
            p: os.stat(p).st_mtime_ns
            for p in Path("/sys/fs/cgroup").glob("**/cgroup.procs")
            if p.is_file()
        }
        if Path("/sys/fs/cgroup").exists()
        else {}
    )
    backend = RealBackend(
        BackendOptions(run_dir=home / "run", cgroup_root=mount), generate_arrivals=False
    )
    try:
        plan = intent_pb2.NodePlan(
            generation=1,
            allocations=[
                intent_pb2.Allocation(
                    intent_id="w", workload_class=intent_pb2.WORKLOAD_CLASS_ONLINE, workers=1
                )
            ],
        )
        applied = backend.apply(plan)
        assert applied[0].cgroup_mode == "dry-run"
        assert Path(backend.cgroup_plan_path()).is_relative_to(home / "run")
        assert json.loads(Path(backend.cgroup_plan_path()).read_text())["groups"][0]["pids"]
    finally:
        backend.stop()
    assert snapshot(mount) == before
    sys_after = {p: os.stat(p).st_mtime_ns for p in sys_before if p.exists()}
    assert sys_after == sys_before


@pytest.mark.integration
def test_delegated_backend_writes_inside_the_subtree_and_attaches_its_workers(
    home: Path, tmp_path: Path
) -> None:
    from parfusion.v1 import intent_pb2
    from services.nodeagent.backend import BackendOptions
    from services.nodeagent.real import RealBackend

    root = fake_cgroupfs(tmp_path / "delegated")
    sibling = fake_cgroupfs(tmp_path / "sibling")
    sibling_before = snapshot(sibling)
    options = BackendOptions(
        run_dir=home / "run", cgroup_mode="delegated", cgroup_delegated_path=str(root)
    )
    backend = RealBackend(options, generate_arrivals=False)
    try:
        plan = intent_pb2.NodePlan(
            generation=2,
            allocations=[
                intent_pb2.Allocation(
                    intent_id="train",
                    workload_class=intent_pb2.WORKLOAD_CLASS_BATCH,
                    workers=2,
                    cgroup=intent_pb2.CgroupPlan(
                        path="parfusion/train", cpu_weight=10, cpu_max="50000 100000"
                    ),
                )
            ],
        )
        applied = backend.apply(plan)
        assert applied[0].cgroup_mode == "delegated"
        group = root / "parfusion" / "train"
        assert (group / "cpu.weight").read_text() == "10"
        assert (group / "cpu.max").read_text() == "50000 100000"
        attached = {int(x) for x in (group / "cgroup.procs").read_text().split()}
        assert attached == backend.owned_pids() and len(attached) == 2
        doc = json.loads(Path(backend.cgroup_plan_path()).read_text())
        assert doc["mode"] == "delegated" and not doc["errors"]
    finally:
        backend.stop()
    assert snapshot(sibling) == sibling_before
