"""An offloaded weight copied file to file maps with huge pages, as one written from memory does.

The forward maps each disk-offloaded weight again every time it runs; mapped
at 4 KiB a page its GEMM ran ~8% slower than on in-memory weights (TLB misses,
dear on a VM). The copy writes whole 2 MiB pieces so that the kernel keeps
huge page-cache folios; this checks the mapping the forward gets really is
PMD-mapped. Kernels or filesystems without huge page-cache folios are skipped.
"""

from __future__ import annotations

import mmap
import os
import sys

import pytest
import torch

from hasten.big_modeling.offload import load_offloaded_weight, offload_file_range

MIB = 1 << 20


def _pmd_mapped_kib(address: int) -> int:
    """FilePmdMapped of the mapping holding `address` in this process (0 if none)."""
    inside = False
    with open("/proc/self/smaps", encoding="ascii") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and ":" not in head:  # a mapping's first line: start-end perms ...
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start <= address < end
            elif inside and head == "FilePmdMapped:":
                return int(line.split()[1])
    return 0


def _written_in_pieces_maps_huge(path) -> bool:
    """Does this kernel keep a file written in 2 MiB pieces as huge folios that map one per PMD?"""
    data = memoryview(os.urandom(4 * MIB))
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    for start in range(0, len(data), 2 * MIB):
        os.write(descriptor, data[start:start + 2 * MIB])
    os.close(descriptor)
    descriptor = os.open(path, os.O_RDONLY)
    mapping = mmap.mmap(descriptor, len(data), flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
    os.close(descriptor)
    try:
        view = torch.frombuffer(mapping, dtype=torch.uint8)
        huge = _pmd_mapped_kib(view.data_ptr()) > 0
        del view
        return huge
    finally:
        mapping.close()


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(mmap, "MAP_POPULATE"),
                    reason="huge page-cache folios are a Linux matter")
def test_a_weight_copied_file_to_file_maps_with_huge_pages(tmp_path):
    if not _written_in_pieces_maps_huge(tmp_path / "probe"):
        pytest.skip("this kernel or filesystem keeps no huge page-cache folios")
    weight = torch.randn(2 * MIB)  # 8 MiB of float32, after a 4-byte header so the source is not page-aligned
    (tmp_path / "shard").write_bytes(b"head" + weight.numpy().tobytes())
    index = offload_file_range(tmp_path / "shard", 4, weight.numel() * 4, torch.float32, [weight.numel()], "w",
                               tmp_path / "off", index={})
    loaded = load_offloaded_weight(tmp_path / "off" / "w.dat", index["w"])
    assert torch.equal(loaded, weight)
    # With copy_file_range the page cache held small folios and this was 0 KiB: every forward paid 4 KiB pages.
    assert _pmd_mapped_kib(loaded.data_ptr()) >= 2048
