"""Where the kernel's interrupt entry stubs lie, read from kallsyms' head
(memprof/sources/ebpf/kmem.py): the BPF programs drop an allocation whose task entered the
kernel through one of them (bpf/kmem.bpf.c, in_task_work)."""
from __future__ import annotations

from pathlib import Path

from memprof.sources.ebpf.kmem import interrupt_entry_text, read_interrupt_entry_text

# The head of this machine's /proc/kallsyms (Linux 6.18, x86-64), in its own order.
KALLSYMS_HEAD = """\
ffffffff81000080 T entry_SYSCALL_64
ffffffff81000300 T irq_entries_start
ffffffff81000a10 T asm_exc_divide_error
ffffffff81000c60 T asm_exc_page_fault
ffffffff81000d10 T asm_exc_double_fault
ffffffff81000d40 T asm_common_interrupt
ffffffff81000d80 T asm_spurious_interrupt
ffffffff81000db0 T asm_sysvec_error_interrupt
ffffffff81000df0 T asm_sysvec_apic_timer_interrupt
ffffffff81000ed0 T asm_sysvec_irq_work
ffffffff81000f50 T asm_sysvec_kvm_asyncpf_interrupt
ffffffff81000f70 T __irqentry_text_end
ffffffff81000f70 T swapgs_restore_regs_and_return_to_usermode
ffffffff810015b0 T asm_exc_nmi
""".splitlines()


def test_the_stubs_run_from_asm_common_interrupt_to_the_next_other_symbol():
    assert interrupt_entry_text(KALLSYMS_HEAD) == (0xffffffff81000d40, 0xffffffff81000f70)


def test_order_in_the_file_does_not_matter():
    assert interrupt_entry_text(list(reversed(KALLSYMS_HEAD))) == (0xffffffff81000d40, 0xffffffff81000f70)


def test_a_page_fault_return_address_is_outside():
    start, end = interrupt_entry_text(KALLSYMS_HEAD)
    page_fault, timer = 0xffffffff81000c60 + 0x20, 0xffffffff81000df0 + 0x10
    assert not start <= page_fault < end
    assert start <= timer < end


def test_without_the_stubs_nothing_is_told_apart():
    without = [line for line in KALLSYMS_HEAD if "asm_common_interrupt" not in line]
    assert interrupt_entry_text(without) == (0, 0)
    assert interrupt_entry_text(KALLSYMS_HEAD[:6]) == (0, 0)  # the block runs to the end of what was read
    hidden = [line.replace("ffffffff81000d40", "0000000000000000") for line in KALLSYMS_HEAD]
    assert interrupt_entry_text(hidden) == (0, 0)  # kptr_restrict: addresses read as 0


def test_malformed_lines_are_skipped():
    noisy = ["", "garbage", "zzzz T asm_common_interrupt", "ffffffff81000d40 D asm_sysvec_data", *KALLSYMS_HEAD]
    assert interrupt_entry_text(noisy) == (0xffffffff81000d40, 0xffffffff81000f70)


def test_an_unreadable_kallsyms_gives_none(tmp_path: Path):
    assert read_interrupt_entry_text(str(tmp_path / "absent")) == (0, 0)
    head = tmp_path / "kallsyms"
    head.write_text("\n".join(KALLSYMS_HEAD) + "\n")
    assert read_interrupt_entry_text(str(head)) == (0xffffffff81000d40, 0xffffffff81000f70)
