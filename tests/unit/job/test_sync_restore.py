"""Restore's guarantees, against an in-memory remote (this module only; real backends are in functional/)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from sagequeue.job import neuron, sync
from sagequeue.job.remote import Deadline, PublishResult, RegistryRecord, RemoteEntry, RemoteFile

VERSION = "2.14.213.0+013d129b"


class MemoryRemote:
    url = "memory://"

    def __init__(
        self,
        entries: dict[str, dict[str, bytes]],
        corrupt: set[str] = frozenset(),
        fail_after: int | None = None,
    ) -> None:
        self.data = entries
        self.corrupt = corrupt
        self.fail_after = fail_after
        self.offsets: list[tuple[str, int]] = []

    def entries(self, version: str) -> dict[str, RemoteEntry]:
        return {
            module: RemoteEntry(
                version,
                module,
                tuple(RemoteFile(n, len(b), hashlib.sha256(b).hexdigest()) for n, b in sorted(files.items())),
            )
            for module, files in self.data.items()
        }

    def verified_files(self, entry: RemoteEntry) -> tuple[RemoteFile, ...]:
        return entry.files

    @contextmanager
    def open_file(
        self, entry: RemoteEntry, file: RemoteFile, offset: int = 0, end: int | None = None
    ) -> Iterator[Iterator[bytes]]:
        self.offsets.append((file.name, offset))
        body = self.data[entry.module][file.name][:end]
        if f"{entry.module}/{file.name}" in self.corrupt:
            body = body[:-1] + b"?"

        def chunks() -> Iterator[bytes]:
            sent = 0
            for start in range(offset, len(body), 1000):
                if self.fail_after is not None and sent >= self.fail_after:
                    self.fail_after = None  # the next attempt succeeds
                    raise ConnectionResetError("connection reset by peer")
                piece = body[start : start + 1000]
                sent += len(piece)
                yield piece

        yield chunks()

    def publish(
        self, entries: Sequence[neuron.LocalEntry], records: Sequence[RegistryRecord], deadline: Deadline
    ) -> PublishResult:
        raise AssertionError("restore never publishes")


def _files(seed: str, neff: int = 10_000) -> dict[str, bytes]:
    return {
        "compile_flags.json": b"[]",
        "model.hlo_module.pb": seed.encode() * 100,
        "model.neff": hashlib.sha256(seed.encode()).digest() * (neff // 32),
        "model.done": b"",
    }


def test_an_interrupted_file_resumes_where_it_stopped(tmp_path: Path) -> None:
    remote = MemoryRemote({"MODULE_1+aa": _files("one")}, fail_after=4000)
    report = sync.restore(remote, tmp_path, VERSION, workers=1, progress=False)
    assert report.restored == [neuron.entry_key(VERSION, "MODULE_1+aa")]
    neff_offsets = [offset for name, offset in remote.offsets if name == "model.neff"]
    assert neff_offsets[0] == 0
    assert neff_offsets[1] >= 4000  # the second attempt asked only for the rest
    restored = tmp_path / neuron.version_dir(VERSION) / "MODULE_1+aa" / "model.neff"
    assert restored.read_bytes() == remote.data["MODULE_1+aa"]["model.neff"]


def test_a_part_file_left_by_an_earlier_run_is_resumed(tmp_path: Path) -> None:
    files = _files("two")
    staging = sync.staging_dir(tmp_path) / neuron.version_dir(VERSION) / "MODULE_2+aa"
    staging.mkdir(parents=True)
    (staging / "model.neff.part").write_bytes(files["model.neff"][:6000])
    remote = MemoryRemote({"MODULE_2+aa": files})
    report = sync.restore(remote, tmp_path, VERSION, progress=False)
    assert ("model.neff", 6000) in remote.offsets
    assert report.bytes_downloaded == sum(len(b) for b in files.values()) - 6000
    assert not staging.exists()


def test_corrupt_bytes_are_never_installed(tmp_path: Path) -> None:
    remote = MemoryRemote(
        {"MODULE_3+aa": _files("three"), "MODULE_4+aa": _files("four")}, corrupt={"MODULE_3+aa/model.neff"}
    )
    report = sync.restore(remote, tmp_path, VERSION, progress=False)
    assert report.restored == [neuron.entry_key(VERSION, "MODULE_4+aa")]
    assert "checksum mismatch" in report.failed[neuron.entry_key(VERSION, "MODULE_3+aa")]
    assert not (tmp_path / neuron.version_dir(VERSION) / "MODULE_3+aa").exists()


def test_local_entries_decide_what_is_fetched(tmp_path: Path) -> None:
    vdir = tmp_path / neuron.version_dir(VERSION)
    for module, names in {
        "MODULE_5+aa": ["model.neff", "model.done"],  # complete: kept
        "MODULE_6+aa": ["model.hlo_module.pb", "model.hlo_module.pb.lock"],  # compiling now: left alone
        "MODULE_7+aa": ["model.hlo_module.pb", "model.log"],  # failed: replaced by the good remote entry
    }.items():
        (vdir / module).mkdir(parents=True)
        for name in names:
            (vdir / module / name).write_bytes(b"local")
    remote = MemoryRemote(
        {m: _files(m) for m in ("MODULE_5+aa", "MODULE_6+aa", "MODULE_7+aa", "MODULE_8+aa")}
    )
    report = sync.restore(remote, tmp_path, VERSION, progress=False)
    key = lambda m: neuron.entry_key(VERSION, m)  # noqa: E731
    assert report.already_local == [key("MODULE_5+aa")]
    assert report.busy == [key("MODULE_6+aa")]
    assert sorted(report.restored) == [key("MODULE_7+aa"), key("MODULE_8+aa")]
    assert (vdir / "MODULE_5+aa" / "model.neff").read_bytes() == b"local"
    assert (vdir / "MODULE_6+aa" / "model.hlo_module.pb.lock").exists()
    assert neuron.entry_state(vdir / "MODULE_7+aa") is neuron.EntryState.COMPLETE


def test_only_the_requested_modules_are_restored(tmp_path: Path) -> None:
    remote = MemoryRemote({m: _files(m) for m in ("MODULE_1+bb", "MODULE_2+bb", "MODULE_3+bb")})
    report = sync.restore(remote, tmp_path, VERSION, ["MODULE_2+bb"], progress=False)
    assert report.remote_entries == 1
    assert [e.module for e in neuron.scan(tmp_path, VERSION)] == ["MODULE_2+bb"]


def test_large_files_arrive_as_parallel_ranges_and_resume_by_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sync, "SPLIT_SIZE", 4096)
    monkeypatch.setattr(sync, "RANGE_SIZE", 2048)
    files = _files("big", neff=10_000)  # 9984 bytes: five ranges
    staging = sync.staging_dir(tmp_path) / neuron.version_dir(VERSION) / "MODULE_9+aa"
    staging.mkdir(parents=True)
    # GIVEN an earlier run wrote ranges 0 and 2 before it died
    partial = bytearray(len(files["model.neff"]))
    for index in (0, 2):
        partial[index * 2048 : (index + 1) * 2048] = files["model.neff"][index * 2048 : (index + 1) * 2048]
    (staging / "model.neff.part").write_bytes(bytes(partial))
    (staging / "model.neff.ranges").write_text("0\n2\n")
    remote = MemoryRemote({"MODULE_9+aa": files})
    report = sync.restore(remote, tmp_path, VERSION, progress=False)
    # THEN only the missing ranges were asked for, and the file is whole and verified
    neff_offsets = sorted(offset for name, offset in remote.offsets if name == "model.neff")
    assert neff_offsets == [2048, 6144, 8192]
    assert report.restored == [neuron.entry_key(VERSION, "MODULE_9+aa")]
    restored = tmp_path / neuron.version_dir(VERSION) / "MODULE_9+aa" / "model.neff"
    assert restored.read_bytes() == files["model.neff"]
