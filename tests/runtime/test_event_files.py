"""Event files: round trips, mappings, appends, cut and corrupt files, the dataset and its collates."""

from __future__ import annotations

import os
import shutil
import struct
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from soagen.runtime import event_files
from soagen.runtime.errors import (
    CollectionFileError,
    CorruptFileError,
    IncompleteEventWarning,
    NotACollectionFileError,
    TruncatedFileError,
    WrongLayoutFileError,
)
from soagen.runtime.event_files import (
    EventDataset,
    EventFile,
    EventWriter,
    collate_events,
    concatenate_events,
)
from tests.runtime.test_files import _mapping_of, _raw, buffer_bytes, random_filled

SCHEMA = """
layout Hits {
    align 128
    column float32 x, y
    column uint16[3] adc packed
    scalar float64 bfield
}
layout Tracks {
    column float32[2] p
    column int64 charge
}
layout Other {
    column float32 x
}
"""

# Sizes per event: n = 0 and 1 among them, the two layouts' different.
COUNTS = [(3, 0), (0, 1), (1, 5), (17, 2)]


@pytest.fixture(scope="module")
def soa(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    from tests.helpers import generate_package, import_generated

    root = tmp_path_factory.mktemp("event_files")
    (root / "events.soa").write_text(SCHEMA)
    generate_package(root / "events.soa", root, "pkg_event_files")
    return import_generated(root, "pkg_event_files", "events")


def make_events(soa: ModuleType, counts: list[tuple[int, int]]) -> list[dict[str, Any]]:
    events = []
    for seed, (hits, tracks) in enumerate(counts):
        hit_collection = random_filled(soa.Hits, hits, seed=seed)
        # Equal scalars in every event, so that the events concatenate.
        hit_collection.bfield.fill_(3.8)
        events.append(
            {"Hits": hit_collection, "Tracks": random_filled(soa.Tracks, tracks, seed=100 + seed)}
        )
    return events


def write(path: Path, soa: ModuleType, events: list[dict[str, Any]]) -> None:
    with EventWriter(path, [soa.Hits, soa.Tracks]) as writer:
        for event in events:
            writer.append(event)


def assert_same_events(read: EventFile, events: list[dict[str, Any]]) -> None:
    assert len(read) == len(events)
    for got, expected in zip(read, events, strict=True):
        assert list(got) == ["Hits", "Tracks"]
        for name, collection in expected.items():
            assert got[name].size == collection.size
            assert buffer_bytes(got[name]) == buffer_bytes(collection), name


@pytest.mark.parametrize("mmap", [True, False])
def test_events_round_trip_bit_for_bit(soa: ModuleType, tmp_path: Path, mmap: bool) -> None:
    path = tmp_path / "events.soae"
    events = make_events(soa, COUNTS)
    write(path, soa, events)
    with EventFile(path, [soa.Hits, soa.Tracks], mmap=mmap, verify=True) as read:
        assert read.truncated is None
        assert_same_events(read, events)
        assert buffer_bytes(read[-1]["Tracks"]) == buffer_bytes(events[-1]["Tracks"])
        assert read[0]["Hits"].read_only == mmap
        with pytest.raises(IndexError, match=f"{path} holds 4 events: there is no event 4"):
            read[4]
    # Records follow one another, each at a multiple of 8, with nothing after the last.
    offsets = EventFile(path, [soa.Hits, soa.Tracks]).record_offsets
    assert all(offset % event_files.RECORD_ALIGNMENT == 0 for offset in offsets)
    assert list(offsets) == sorted(offsets) and len(offsets) == 4


def test_a_slice_appends_as_its_own_elements(soa: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "events.soae"
    hits = random_filled(soa.Hits, 50, seed=5)
    tracks = random_filled(soa.Tracks, 9, seed=6)
    with EventWriter(path, [soa.Hits, soa.Tracks]) as writer:
        assert writer.append(Hits=hits[10:20], Tracks=tracks) == 0
    event = EventFile(path, [soa.Hits, soa.Tracks])[0]
    assert event["Hits"].size == 10
    assert event["Hits"].numpy("adc").tobytes() == hits[10:20].numpy("adc").tobytes()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_mapped_events_are_the_files_pages_aligned(soa: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "events.soae"
    write(path, soa, make_events(soa, COUNTS))
    read = EventFile(path, [soa.Hits, soa.Tracks])
    for event in read:
        for name, collection in event.items():
            if not collection.nbytes:
                continue  # Tracks with n=0: no bytes, no address in the file
            address = _raw(collection).ctypes.data
            assert _mapping_of(address) == str(path.resolve()), name
            assert address % type(collection).ALIGNMENT == 0
    copied = EventFile(path, [soa.Hits, soa.Tracks], mmap=False)[3]["Hits"]
    assert _mapping_of(_raw(copied).ctypes.data) != str(path.resolve())


def test_a_second_writer_appends(soa: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "events.soae"
    events = make_events(soa, COUNTS)
    write(path, soa, events[:2])
    with EventWriter(path, [soa.Hits, soa.Tracks]) as writer:
        assert len(writer) == 2
        for event in events[2:]:
            writer.append(event)
        # One writer at a time.
        with pytest.raises(CollectionFileError, match=f"{path} is open in another EventWriter"):
            EventWriter(path, [soa.Hits, soa.Tracks])
    assert_same_events(EventFile(path, [soa.Hits, soa.Tracks], verify=True), events)


def test_a_writer_that_finds_no_file_never_replaces_one_made_meanwhile(
    soa: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers creating one file at once: the second to look found no file, the first made
    it and appends; the second must not rename a new file over it (the first would append to a
    file no longer under the name)."""
    path = tmp_path / "events.soae"
    events = make_events(soa, COUNTS)
    with EventWriter(path, [soa.Hits, soa.Tracks]) as first:
        first.append(events[0])
        monkeypatch.setattr(event_files.os.path, "exists", lambda _: False)
        with pytest.raises(CollectionFileError, match="open in another EventWriter"):
            EventWriter(path, [soa.Hits, soa.Tracks])
        monkeypatch.undo()
        first.append(events[1])
    assert_same_events(EventFile(path, [soa.Hits, soa.Tracks], verify=True), events[:2])
    assert [entry.name for entry in tmp_path.iterdir()] == ["events.soae"]  # no temporary left


def test_an_append_that_fails_part_way_leaves_the_file_as_it_was(
    soa: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk in the middle of a record: the record is cut off, and the writer appends the
    next event after the last complete one."""
    path = tmp_path / "events.soae"
    events = make_events(soa, [(3, 2), (4, 1), (2, 2)])
    real = os.pwrite
    calls = {"count": 0}

    def full_disk(descriptor: int, data: Any, offset: int) -> int:
        calls["count"] += 1
        if calls["count"] == 2:  # the record's header went out, its payload does not
            raise OSError(28, "No space left on device")
        return real(descriptor, data, offset)

    with EventWriter(path, [soa.Hits, soa.Tracks]) as writer:
        writer.append(events[0])
        size = path.stat().st_size
        monkeypatch.setattr(event_files.os, "pwrite", full_disk)
        with pytest.raises(OSError, match="No space left"):
            writer.append(events[1])
        monkeypatch.undo()
        assert path.stat().st_size == size
        writer.append(events[2])
    with EventFile(path, [soa.Hits, soa.Tracks], verify=True) as read:
        assert read.truncated is None
        assert_same_events(read, [events[0], events[2]])


def test_another_layouts_file_is_refused_naming_both(soa: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "events.soae"
    write(path, soa, make_events(soa, COUNTS[:1]))
    expected = (
        f"{path} holds events of Hits \\(layout key {soa.Hits.LAYOUT_KEY}\\), Tracks \\(layout "
        f"key {soa.Tracks.LAYOUT_KEY}\\), not of Hits \\(layout key {soa.Hits.LAYOUT_KEY}\\), "
        f"Other \\(layout key {soa.Other.LAYOUT_KEY}\\)"
    )
    with pytest.raises(WrongLayoutFileError, match=expected):
        EventFile(path, [soa.Hits, soa.Other])
    with pytest.raises(WrongLayoutFileError, match=expected):
        EventWriter(path, [soa.Hits, soa.Other])
    with pytest.raises(WrongLayoutFileError, match="not of Tracks .*, Hits"):
        EventFile(path, [soa.Tracks, soa.Hits])


def test_appends_that_do_not_fit_the_layouts_are_refused(soa: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "events.soae"
    hits, tracks = soa.Hits.allocate(2, zero=True), soa.Tracks.allocate(2, zero=True)
    with EventWriter(path, [soa.Hits, soa.Tracks]) as writer:
        with pytest.raises(ValueError, match="Tracks is missing; Other is no layout of the file"):
            writer.append(Hits=hits, Other=soa.Other.allocate(1))
        with pytest.raises(WrongLayoutFileError, match="but a Other .* was given"):
            writer.append(Hits=hits, Tracks=soa.Other.allocate(1))
        with pytest.raises(ValueError, match="Hits is given twice"):
            writer.append({"Hits": hits}, Hits=hits, Tracks=tracks)
        writer.append(Hits=hits, Tracks=tracks)
    with pytest.raises(ValueError, match="the EventWriter is closed"):
        writer.append(Hits=hits, Tracks=tracks)
    assert len(EventFile(path, [soa.Hits, soa.Tracks])) == 1


def test_other_files_are_refused(soa: ModuleType, tmp_path: Path) -> None:
    single = tmp_path / "hits.soac"
    soa.Hits.allocate(3, zero=True).save(single)
    with pytest.raises(NotACollectionFileError, match=f"{single} is a soagen collection file"):
        EventFile(single, [soa.Hits])
    other = tmp_path / "other.bin"
    other.write_bytes(b"not an event file at all")
    with pytest.raises(NotACollectionFileError, match=f"{other} is not a soagen event file"):
        EventFile(other, [soa.Hits])
    with pytest.raises(TruncatedFileError, match=f"{other} is truncated"):
        other.write_bytes(event_files.MAGIC + b"\x01\x00")
        EventFile(other, [soa.Hits])


def test_a_file_cut_anywhere_in_its_last_event_reads_its_complete_events(
    soa: ModuleType, tmp_path: Path
) -> None:
    path = tmp_path / "events.soae"
    events = make_events(soa, [(2, 1), (0, 3), (3, 2)])
    write(path, soa, events)
    full = path.read_bytes()
    last = EventFile(path, [soa.Hits, soa.Tracks]).record_offsets[-1]
    assert len(full) - last > event_files.record_header_size(2)
    cut = tmp_path / "cut.soae"
    for length in range(last, len(full)):
        cut.write_bytes(full[:length])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            read = EventFile(cut, [soa.Hits, soa.Tracks], verify=True)
        assert len(read) == 2, length
        if length == last:
            assert read.truncated is None and not caught
            continue
        tail = read.truncated
        assert tail is not None
        assert (tail.offset, tail.event_index, tail.bytes_found) == (last, 2, length - last)
        header_size = event_files.record_header_size(2)
        assert tail.reason == (
            f"its record header needs {header_size} bytes"
            if length - last < header_size
            else f"its record header says {len(full) - last} bytes"
        )
        assert [warning.category for warning in caught] == [IncompleteEventWarning]
        assert f"{cut} is cut short: event 2 at offset {last} is incomplete" in str(
            caught[0].message
        )
        assert_same_events(read, events[:2])
        read.close()


def test_a_zero_filled_or_unchecked_tail_is_an_incomplete_event(
    soa: ModuleType, tmp_path: Path
) -> None:
    """What an operating system crash leaves: the file's size grew, its blocks were never written."""
    path = tmp_path / "events.soae"
    events = make_events(soa, [(2, 1), (5, 3)])
    write(path, soa, events)
    full = path.read_bytes()
    last = EventFile(path, [soa.Hits, soa.Tracks]).record_offsets[-1]
    header_size = event_files.record_header_size(2)
    for kept in (0, 10, header_size - 1):
        path.write_bytes(full[: last + kept] + bytes(len(full) - last - kept))
        nonzero = len(full[last : last + kept].rstrip(b"\0"))
        with pytest.warns(IncompleteEventWarning, match=f"only zeros follow its first {nonzero} "):
            assert len(EventFile(path, [soa.Hits, soa.Tracks])) == 1
    # The header whole, the payload not: the last event's payload CRC is checked at every open.
    path.write_bytes(full[: last + header_size] + bytes(len(full) - last - header_size))
    with pytest.warns(IncompleteEventWarning, match="its payload's CRC32 is"):
        read = EventFile(path, [soa.Hits, soa.Tracks])
    assert len(read) == 1 and read.truncated is not None


def test_a_corrupt_payload_is_refused_with_verify_naming_the_event(
    soa: ModuleType, tmp_path: Path
) -> None:
    path = tmp_path / "events.soae"
    write(path, soa, make_events(soa, COUNTS))
    offset = EventFile(path, [soa.Hits, soa.Tracks]).record_offsets[1]
    data = bytearray(path.read_bytes())
    data[EventFile(path, [soa.Hits, soa.Tracks]).record_offsets[2] - 20] ^= 0x04
    path.write_bytes(bytes(data))
    for mmap in (True, False):
        read = EventFile(path, [soa.Hits, soa.Tracks], mmap=mmap, verify=True)
        read[0]
        with pytest.raises(
            CorruptFileError,
            match=f"{path}: event 1 \\(the record at offset {offset}\\) is corrupt: its "
            f"payload's CRC32",
        ):
            read[1]
        # Without verify the bytes are not read.
        EventFile(path, [soa.Hits, soa.Tracks], mmap=mmap)[1]


def test_a_corrupt_record_header_is_refused_naming_the_event(
    soa: ModuleType, tmp_path: Path
) -> None:
    path = tmp_path / "events.soae"
    write(path, soa, make_events(soa, COUNTS))
    offset = EventFile(path, [soa.Hits, soa.Tracks]).record_offsets[1]
    data = bytearray(path.read_bytes())
    data[offset + 25] ^= 0x01  # Hits' n
    path.write_bytes(bytes(data))
    with pytest.raises(
        CorruptFileError,
        match=f"{path}: event 1 \\(the record at offset {offset}\\) is corrupt: its record "
        f"header's CRC32",
    ):
        EventFile(path, [soa.Hits, soa.Tracks])


def test_appending_after_a_cut_needs_repair(soa: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "events.soae"
    events = make_events(soa, COUNTS)
    write(path, soa, events[:3])
    last = EventFile(path, [soa.Hits, soa.Tracks]).record_offsets[-1]
    with open(path, "r+b") as file:
        file.truncate(last + 40)
    with pytest.raises(TruncatedFileError, match=f"{path} is cut short: event 2 at offset {last}"):
        EventWriter(path, [soa.Hits, soa.Tracks])
    assert os.path.getsize(path) == last + 40  # a refusal changes nothing
    with pytest.warns(IncompleteEventWarning, match="cutting them off \\(repair=True\\)"):
        writer = EventWriter(path, [soa.Hits, soa.Tracks], repair=True, sync_every=2)
    with writer:
        assert len(writer) == 2
        writer.append(events[3])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read = EventFile(path, [soa.Hits, soa.Tracks], verify=True)
    assert_same_events(read, [*events[:2], events[3]])


def test_the_dataset_serves_lists_and_concatenations(soa: ModuleType, tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    path = tmp_path / "events.soae"
    events = make_events(soa, COUNTS)
    write(path, soa, events)
    dataset = EventDataset(path, [soa.Hits, soa.Tracks])
    assert len(dataset) == 4
    lists = list(DataLoader(dataset, batch_size=3, collate_fn=collate_events))
    assert [len(batch) for batch in lists] == [3, 1]
    assert buffer_bytes(lists[1][0]["Tracks"]) == buffer_bytes(events[3]["Tracks"])

    batches = list(DataLoader(dataset, batch_size=3, collate_fn=concatenate_events))
    assert [len(batch) for batch in batches] == [3, 1]
    for batch, part in zip(batches, (events[:3], events[3:]), strict=True):
        for name in ("Hits", "Tracks"):
            counts = [event[name].size for event in part]
            expected_offsets = [0, *torch.tensor(counts).cumsum(0).tolist()]
            assert batch.offsets[name].tolist() == expected_offsets
            collection = batch.collections[name]
            assert collection.size == sum(counts)
            for spec in type(collection).MEMBERS:
                if not spec.per_element:
                    continue
                joined = torch.cat([event[name].member(spec.name) for event in part])
                assert torch.equal(collection.member(spec.name), joined), spec.name
                for index, event in enumerate(part):
                    start, stop = expected_offsets[index], expected_offsets[index + 1]
                    assert collection[start:stop].numpy(spec.name).tobytes() == (
                        event[name].numpy(spec.name).tobytes()
                    )
        assert batch.collections["Hits"].bfield.item() == 3.8


def test_events_whose_scalars_differ_are_not_concatenated(soa: ModuleType) -> None:
    events = make_events(soa, [(2, 1), (1, 1)])
    events[1]["Hits"].bfield.fill_(2.0)
    with pytest.raises(ValueError, match="scalar Hits.bfield is 2.0 in event 1 of the batch"):
        concatenate_events(events)


def test_workers_open_the_file_for_themselves(soa: ModuleType, tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    path = tmp_path / "events.soae"
    events = make_events(soa, COUNTS)
    write(path, soa, events)
    loader = DataLoader(
        EventDataset(path, [soa.Hits, soa.Tracks]),
        batch_size=2,
        num_workers=2,
        collate_fn=concatenate_events,
    )
    batches = list(loader)
    assert [batch.offsets["Tracks"].tolist() for batch in batches] == [[0, 0, 1], [0, 5, 7]]
    assert batches[1].collections["Hits"].numpy("x").tobytes() == (
        events[2]["Hits"].numpy("x").tobytes() + events[3]["Hits"].numpy("x").tobytes()
    )


def test_a_copy_of_the_file_reads_the_same(soa: ModuleType, tmp_path: Path) -> None:
    """Offsets in records are the file's own: nothing depends on where it was written."""
    path = tmp_path / "events.soae"
    events = make_events(soa, COUNTS)
    write(path, soa, events)
    shutil.copy(path, tmp_path / "copy.soae")
    assert_same_events(EventFile(tmp_path / "copy.soae", [soa.Hits, soa.Tracks]), events)


def test_the_readme_snippet_runs_and_its_record_table_is_the_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re

    from generated.gnn import Edges, Nodes
    from tests.helpers import REPO

    section = (REPO / "README.md").read_text().split("#### Event files", 1)[1]
    section = section.split("\n### ", 1)[0]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    nodes, edges = Nodes.allocate(100, zero=True), Edges.allocate(300, zero=True)
    namespace: dict[str, object] = {"Nodes": Nodes, "Edges": Edges, "nodes": nodes}
    namespace |= {"edges": edges, "torch": torch}
    exec(compile(snippet, "README.md (Event files)", "exec"), namespace)
    assert namespace["bounds"].tolist() == [0, 100]  # type: ignore[attr-defined]
    assert namespace["first_nodes"].size == 100  # type: ignore[attr-defined]

    rows = re.findall(r"^\| ([\w +]+) \| (\d+) \| (\w+) \|", section, re.M)
    k = 2  # the table's sizes, spelled for any k, checked at k = 2
    offset, expected = 0, []
    fields = [("marker", "8s"), ("event_index", "Q"), ("record_size", "Q")]
    layout_fields = [("n", "Q"), ("byte_size", "Q"), ("data_offset", "Q")]
    fields += layout_fields * k + [("payload_crc32", "I"), ("header_crc32", "I")]
    for name, code in fields:
        expected.append((offset, struct.calcsize("<" + code), name))
        offset += struct.calcsize("<" + code)
    assert offset == event_files.record_header_size(k)
    described = []
    for start, size, name in rows:
        for j in range(k if "j" in start else 1):
            # "24 + 24j": a product of the number and the letter.
            at = eval(re.sub(r"(\d+)([jk])", r"\1 * \2", start), {"j": j, "k": k})
            described.append((at, int(size), name))
    assert sorted(described) == expected
