"""What `memprof record` says of the values it is given and of what it recorded: a size in
decimal units where a power of two was asked, and the counts in its last line."""
from __future__ import annotations

import click
import pytest

from memprof.cli import record


@pytest.mark.parametrize("value, meant", [("512M", "512MiB"), ("16m", "16MiB"), ("1G", "1GiB"), ("64MB", "64MiB")])
def test_a_ring_buffer_in_decimal_units_is_refused_with_the_binary_size_it_meant(value, meant):
    with pytest.raises(click.BadParameter) as refused:
        record._ring_buffer(None, None, value)
    assert "power of two from 1MiB to 1GiB" in str(refused.value)
    assert f"did you mean {meant}?" in str(refused.value)


@pytest.mark.parametrize("value", ["48MiB", "2GiB", "3M", "2G"])
def test_a_ring_buffer_with_no_binary_twin_gets_no_guess(value):
    with pytest.raises(click.BadParameter) as refused:
        record._ring_buffer(None, None, value)
    assert "did you mean" not in str(refused.value)


@pytest.mark.parametrize("value, taken", [("0", 0), ("16KiB", 16384), ("1GiB", 1 << 30), ("100", 100)])
def test_kernel_sampling_takes_zero_or_a_size_up_to_a_gibibyte(value, taken):
    assert record._kernel_sample_bytes(None, None, value) == taken


@pytest.mark.parametrize("value, says", [("2GiB", "at most 1GiB, or 0 to take every allocation"),
                                         ("-1", "size"), ("lots", "size")])
def test_kernel_sampling_beyond_what_the_probes_draw_is_refused(value, says):
    """The probes draw min(1, S/N) with a 32-bit random number times N (bpf/kmem.bpf.c)."""
    with pytest.raises(click.BadParameter) as refused:
        record._kernel_sample_bytes(None, None, value)
    assert says in str(refused.value)


def test_the_record_summary_writes_lost_and_skipped_counts_with_thousands_separators(tmp_path):
    from memprof.capture.session import RecordResult
    result = RecordResult(tmp_path / "r.memprof", 0, 2_272_820, 2_546_923, 1_815, False, 0, 0, None)
    assert "2,546,923 lost, 1,815 frees skipped by the kernel" in record._summary(result)
