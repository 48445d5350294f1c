"""`sudo memprof record --sources +native -- CMD` puts memprof's LD_PRELOAD interposer into the
user's command (memprof/preload). Played with a real user: the command, run as that user,
loads it (else the loader skips it silently and the native layer is empty), and root's
choice of library is one no third user could have changed."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.ebpf

REPO = Path(__file__).resolve().parents[2]
NATIVE_LEAK = REPO / "examples" / "bin" / "native_leak"


def test_the_users_command_loads_the_interposer_and_its_leak_is_exact(make_user, memprof_as_root):
    if not NATIVE_LEAK.is_file():
        pytest.skip("examples/bin/native_leak is not built (make -C examples)")
    user = make_user()
    recording = user.home / "native.memprof"
    result = memprof_as_root(user, "record", "-q", "-o", recording, "--sources", "+native",
                             "--native-sample-bytes", "0", "--",
                             NATIVE_LEAK, "-n", "300", cwd=user.home)
    assert result.returncode == 0, result.stderr
    assert "leaked=300 bytes=1228800" in result.stdout, result.stdout
    meta = json.loads((recording / "meta.json").read_text())
    native_probes = meta["sources"]["ebpf"]["detail"]["native_probes"]
    assert native_probes["via"] == "preload", native_probes
    library = Path(native_probes["library"])
    assert os.stat(library).st_uid == 0 and not os.stat(library).st_mode & 0o022
    findings = [f for f in user.report_leaks(recording)["findings"] if f["layer"] == "native_heap"]
    assert [(f["live_count"], f["live_bytes"]) for f in findings][:1] == [(300, 300 * 4096)], findings[:3]


def test_preload_with_pid_is_a_usage_error(make_user, memprof_as_root):
    user = make_user()
    result = memprof_as_root(user, "record", "--pid", str(os.getpid()), "--sources", "+native",
                             "--native-probes", "preload", cwd=user.home)
    assert result.returncode == 2, result.stderr
    assert "--native-probes preload needs a command" in result.stderr and "Traceback" not in result.stderr
