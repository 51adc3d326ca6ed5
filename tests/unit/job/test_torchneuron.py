"""The TorchNeuron cache kind's rules: names, namespaces, kind selection, pack planning, and a restore into a
cache a hostile index or a planted link tries to escape (an in-memory store: this module alone)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sagequeue.job import torchneuron
from sagequeue.job.remote import Deadline, Trust

KEY = "abcd" + "0" * 28
NAME = f"ab/cd/{KEY}.neff"


class MemoryStore:
    """A PackStore in a dict, counting ranged reads."""

    url = "mem://cache"

    def __init__(self, base: str = "") -> None:
        self.objects: dict[str, bytes] = {}
        self.ranges = 0
        self.base = base

    def list_paths(self, prefix: str) -> dict[str, int]:
        return {p: len(b) for p, b in self.objects.items() if p.startswith(prefix.rstrip("/") + "/")}

    def namespace_paths(self, prefix: str) -> dict[str, int]:
        """Every writer folder, as S3 lists them."""
        return {
            p: len(b)
            for p, b in self.objects.items()
            if p[len(torchneuron.writer_base(p)[0]) :].startswith(prefix.rstrip("/") + "/")
        }

    def writers(self, paths: list[str]) -> dict[str, str | None]:
        return {p: torchneuron.writer_base(p)[1] for p in paths}

    def read_bytes(self, path: str) -> bytes:
        return self.objects[path]

    @contextlib.contextmanager
    def open_range(self, path: str, start: int, end: int) -> Iterator[Iterator[bytes]]:
        self.ranges += 1
        data = self.objects[path][start:end]
        yield iter([data[i : i + 1000] for i in range(0, len(data), 1000)])

    def put_pack(
        self, pack_path: str, pack: Path, index_path: str, index: bytes, touch: Callable[[], None]
    ) -> bool:
        self.objects[pack_path] = pack.read_bytes()
        self.objects[index_path] = index
        return True

    def delete(self, paths: list[str]) -> None:
        for path in paths:
            self.objects.pop(path, None)


NS = torchneuron.Namespace("2.14.0", "2.22.5.0+abcdef12", "trn2", "32")


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        (NAME, True),
        ("ab/cd/abce" + "0" * 28 + ".neff", False),  # not its own shard
        ("a" * 64 + "/" + "b" * 64 + ".neff", True),
        ("../ab/cd/" + KEY + ".neff", False),
        ("/ab/cd/" + KEY + ".neff", False),
        ("ab/cd/" + KEY + ".neff.tmp", False),
        ("ab/cd/tmpk2j3h4.tmp", False),
        ("AB/CD/" + KEY.upper() + ".neff", False),
    ],
)
def test_entry_names(name: str, ok: bool) -> None:
    assert torchneuron.is_entry_name(name) is ok


def test_safe_target_refuses_a_link_out_anywhere_on_the_path(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "ab").mkdir(parents=True)
    assert torchneuron.safe_target(root, NAME) == root / NAME
    os.symlink(tmp_path, root / "ab" / "cd")
    with pytest.raises(torchneuron.UnsafeNameError, match="outside"):
        torchneuron.safe_target(root, NAME)
    with pytest.raises(torchneuron.UnsafeNameError):
        torchneuron.safe_target(root, "../" + NAME)


def test_namespace_round_trips_and_refuses_separators() -> None:
    assert torchneuron.Namespace.parse(NS.name) == NS
    with pytest.raises(torchneuron.NamespaceError):
        torchneuron.Namespace("2.14__0", "x", "trn2", "1")
    with pytest.raises(torchneuron.NamespaceError):
        torchneuron.Namespace("../x", "x", "trn2", "1")


@pytest.mark.parametrize(
    ("env", "platform"),
    [
        ({"SM_CURRENT_INSTANCE_TYPE": "ml.trn2.48xlarge"}, "trn2"),
        ({"SM_CURRENT_INSTANCE_TYPE": "ml.trn2u.48xlarge"}, "trn2"),
        ({"SM_CURRENT_INSTANCE_TYPE": "ml.trn3.48xlarge"}, "trn3"),
        ({"NEURON_CC_FLAGS": "--target trn3 -O1", "SM_CURRENT_INSTANCE_TYPE": "ml.trn2.48xlarge"}, "trn3"),
        ({"NEURON_PLATFORM_TARGET_OVERRIDE": "trn2", "NEURON_CC_FLAGS": "--target=trn3"}, "trn2"),
    ],
)
def test_platform(env: dict[str, str], platform: str) -> None:
    assert torchneuron.platform_of(env) == platform


def test_platform_unknown_or_unsupported_shares_nothing() -> None:
    with pytest.raises(torchneuron.NamespaceError, match="unknown platform"):
        torchneuron.platform_of({})
    with pytest.raises(torchneuron.NamespaceError, match="trn2 and trn3"):
        torchneuron.platform_of({"SM_CURRENT_INSTANCE_TYPE": "ml.trn1.32xlarge"})


def test_cores() -> None:
    assert torchneuron.cores_of({"NEURON_RT_NUM_CORES": "16"}) == "16"
    assert torchneuron.cores_of({"NEURON_RT_VISIBLE_CORES": "0-3,8"}) == "5"
    assert torchneuron.cores_of({}) == "all"


def test_nki_digest_follows_the_kernel_sources(tmp_path: Path) -> None:
    assert torchneuron.nki_digest([]) == "none"
    (tmp_path / "k.py").write_text("a")
    first = torchneuron.nki_digest([tmp_path])
    assert first == torchneuron.nki_digest([tmp_path])
    (tmp_path / "k.py").write_text("b")
    assert torchneuron.nki_digest([tmp_path]) != first
    with pytest.raises(torchneuron.NamespaceError):
        torchneuron.nki_digest([tmp_path / "missing.py"])


def test_kind_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    assert torchneuron.resolve_kind("torchneuron", {}) == "torchneuron"
    assert torchneuron.resolve_kind(None, {"SAGEQUEUE_CACHE_KIND": "xla"}) == "xla"
    with pytest.raises(ValueError, match="unknown cache kind"):
        torchneuron.resolve_kind("neff", {})
    installed = {"torch-neuronx": "2.14.0"}
    monkeypatch.setattr(torchneuron, "_installed", installed.get)
    assert torchneuron.resolve_kind("auto", {}) == "torchneuron"
    installed["torch-xla"] = "2.9.0"
    assert torchneuron.resolve_kind("auto", {}) == "xla"


def test_child_environment_keeps_locks_out_of_the_shared_directory(tmp_path: Path) -> None:
    root = tmp_path / "neff"
    env = torchneuron.child_environment({"TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR": str(root / "locks")}, root)
    assert env["TORCH_NEURONX_NEFF_CACHE_DIR"] == str(root)
    assert not Path(env["TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"]).is_relative_to(root)
    assert torchneuron.child_environment({}, root)["TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"] == "/tmp/local_cache"


def _fill(root: Path, count: int, seed: int = 3) -> dict[str, bytes]:
    rng = random.Random(seed)
    out = {}
    for _ in range(count):
        key = f"{rng.getrandbits(128):032x}"
        name = f"{key[:2]}/{key[2:4]}/{key}.neff"
        data = rng.randbytes(rng.randint(1, 5000))
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
        out[name] = data
    return out


def test_upload_then_restore_reads_few_ranges_and_checks_every_entry(tmp_path: Path) -> None:
    store = MemoryStore()
    source = tmp_path / "a"
    written = _fill(source, 500)
    (source / "ab" / "cd").mkdir(parents=True, exist_ok=True)
    (source / "ab" / "cd" / "tmpq1w2e3.tmp").write_bytes(b"half")
    report = torchneuron.upload(store, source, NS, pack_bytes=400_000)
    assert sorted(report.published) == sorted(written)
    assert len(report.packs) >= 2
    # a second upload finds everything there
    assert torchneuron.upload(store, source, NS).published == []
    target = tmp_path / "b"
    restored = torchneuron.restore(store, target, NS, workers=4)
    assert sorted(restored.restored) == sorted(written)
    assert {n: (target / n).read_bytes() for n in written} == written
    assert restored.requests <= len(report.packs) * 2
    assert not (target / "ab" / "cd" / "tmpq1w2e3.tmp").exists()
    # another namespace sees nothing
    assert (
        torchneuron.restore(
            store, tmp_path / "c", torchneuron.Namespace("2.14.1", NS.neuronx_cc, "trn2", "32")
        ).restored
        == []
    )


def test_a_corrupt_entry_is_not_installed_and_verify_names_its_pack(tmp_path: Path) -> None:
    store = MemoryStore()
    source = tmp_path / "a"
    written = _fill(source, 20)
    report = torchneuron.upload(store, source, NS)
    pack_path, _ = torchneuron.pack_paths(NS, report.packs[0])
    data = bytearray(store.objects[pack_path])
    data[10] ^= 0xFF
    store.objects[pack_path] = bytes(data)
    restored = torchneuron.restore(store, tmp_path / "b", NS)
    assert len(restored.failed) == 1
    assert len(restored.restored) == len(written) - 1
    assert set(torchneuron.verify(store, NS)) == {report.packs[0]}


def test_an_index_without_its_pack_or_with_overlaps_is_refused(tmp_path: Path) -> None:
    store = MemoryStore()
    digest = hashlib.sha256(b"x" * 10).hexdigest()
    for pack_id, entries, body in (
        ("no-pack-0001", [[NAME, 0, 10, digest]], None),
        (
            "overlap-0001",
            [[NAME, 0, 10, digest], ["ab/cd/abcd" + "1" * 28 + ".neff", 5, 10, digest]],
            b"x" * 20,
        ),
        ("other-ns-001", [[NAME, 0, 10, digest]], b"x" * 10),
    ):
        described = NS.describe() if pack_id != "other-ns-001" else dict(NS.describe(), cores="8")
        pack_path, index_path = torchneuron.pack_paths(NS, pack_id)
        store.objects[index_path] = json.dumps(
            {"format": 1, "pack": pack_id, "namespace": described, "entries": entries}
        ).encode()
        if body is not None:
            store.objects[pack_path] = body
    report = torchneuron.restore(store, tmp_path / "root", NS)
    assert set(report.refused_packs) == {"no-pack-0001", "overlap-0001", "other-ns-001"}
    assert report.restored == []


def test_the_disk_floor_and_the_byte_cap_leave_entries_to_the_compiler(tmp_path: Path) -> None:
    store = MemoryStore()
    source = tmp_path / "a"
    written = _fill(source, 30)
    torchneuron.upload(store, source, NS)
    floored = torchneuron.restore(store, tmp_path / "b", NS, min_free_bytes=10**18)
    assert floored.restored == []
    assert len(floored.over_budget) == 30
    smallest = sorted(len(b) for b in written.values())
    capped = torchneuron.restore(store, tmp_path / "c", NS, max_bytes=sum(smallest[:10]))
    assert len(capped.restored) == 10


def test_a_cancelled_restore_stops_and_leaves_no_staging(tmp_path: Path) -> None:
    store = MemoryStore()
    _fill(tmp_path / "a", 50)
    torchneuron.upload(store, tmp_path / "a", NS)
    control = Deadline(None)
    control.cancel.set()
    root = tmp_path / "b"
    report = torchneuron.restore(store, root, NS, control=control)
    assert report.restored == []
    assert report.stopped
    assert [p.name for p in tmp_path.iterdir() if "staging" in p.name] == []


def test_plan_runs_groups_neighbours_and_splits_large_reads() -> None:
    entries = [torchneuron.IndexEntry(f"n{i}", i * 1000, 1000, "0" * 64) for i in range(100)]
    runs = torchneuron.plan_runs([("p", e) for e in entries])
    assert len(runs) == 1
    big = [torchneuron.IndexEntry(f"b{i}", i * 3 * 1024 * 1024, 3 * 1024 * 1024, "0" * 64) for i in range(6)]
    assert len(torchneuron.plan_runs([("p", e) for e in big])) == 3
    sparse = [torchneuron.IndexEntry(f"s{i}", i * 10 * 1024 * 1024, 10, "0" * 64) for i in range(3)]
    assert len(torchneuron.plan_runs([("p", e) for e in sparse])) == 3


def test_a_pack_whose_index_never_came_is_invisible_and_verify_reports_it(tmp_path: Path) -> None:
    """An upload cut between the pack and its index (S3) leaves bytes no reader follows."""
    store = MemoryStore()
    pack_path, _ = torchneuron.pack_paths(NS, "cut-short-0001")
    store.objects[pack_path] = b"x" * 100
    report = torchneuron.restore(store, tmp_path / "root", NS)
    assert report.remote_entries == 0
    assert report.restored == []
    assert torchneuron.verify(store, NS) == {"cut-short-0001": "a pack no index names (an upload cut short)"}


def test_a_trust_list_restores_only_its_writers_packs_and_each_writer_publishes_in_its_folder(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    mine, theirs, legacy = (MemoryStore(base) for base in ("writers/team-a/", "writers/team-b/", ""))
    for writer in (mine, theirs, legacy):
        writer.objects = store.objects  # one bucket, three handles
    a = _fill(tmp_path / "a", 20, seed=1)
    b = _fill(tmp_path / "b", 20, seed=2)
    c = _fill(tmp_path / "c", 20, seed=3)
    assert torchneuron.upload(mine, tmp_path / "a", NS).packs[0].startswith("writers/team-a/")
    assert torchneuron.upload(theirs, tmp_path / "b", NS).packs[0].startswith("writers/team-b/")
    assert "/" not in torchneuron.upload(legacy, tmp_path / "c", NS).packs[0]
    assert all(p.startswith(("writers/team-a/", "writers/team-b/", "torchneuron/")) for p in store.objects)

    report = torchneuron.restore(store, tmp_path / "job", NS, trust=Trust.parse("team-a"))
    assert sorted(report.restored) == sorted(a)
    assert sorted(report.untrusted.values()) == ["team-b", "unknown"]
    assert all(not (tmp_path / "job" / n).exists() for n in (*b, *c))
    # under the trust list, team-b's entries count as missing: team-a publishes its own copy
    assert sorted(
        torchneuron.upload(mine, tmp_path / "b", NS, trust=Trust.parse("team-a")).published
    ) == sorted(b)
    # without a list every writer is restored
    assert len(torchneuron.restore(store, tmp_path / "any", NS).restored) == 60
    # verify names the other writers' packs; their references remove them
    untrusted: dict[str, str] = {}
    assert torchneuron.verify(store, NS, trust=Trust.parse("team-a"), untrusted=untrusted) == {}
    assert sorted(untrusted.values()) == ["team-b", "unknown"]
    torchneuron.remove_packs(store, NS, sorted(untrusted))
    assert all(p.startswith("writers/team-a/") for p in store.objects)


@pytest.mark.parametrize(
    "ref", ["a/b/20261127T000000-abc", "writers/../20261127T000000-abc", "writers/x/y/z"]
)
def test_a_pack_reference_outside_a_writer_folder_is_refused(ref: str) -> None:
    with pytest.raises(ValueError, match="not a pack"):
        torchneuron.pack_paths(NS, ref)


def test_plan_runs_spreads_the_first_reads_over_the_packs() -> None:
    """Parallel reads start on different packs: a store that serves a range by reading its object (moto,
    under a lock per object) would otherwise serve the first reads one after another."""
    wanted = [
        (f"pack-{p}", torchneuron.IndexEntry(f"p{p}-{i}", i * 4 * 1024 * 1024, 4 * 1024 * 1024, "0" * 64))
        for p in range(3)
        for i in range(8)
    ]
    runs = torchneuron.plan_runs(wanted)
    assert len(runs) == 12
    assert [r.pack_path for r in runs[:3]] == ["pack-0", "pack-1", "pack-2"]
    assert sorted(e.name for r in runs for e in r.entries) == sorted(e.name for _, e in wanted)
