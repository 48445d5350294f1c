"""`sudo memprof doctor` keeps root (it checks what recording needs), so `--python PATH` under
sudo would have root open and inspect whatever the user names: a device, a file only root may
read (saying what it is), or whether a path exists at all. It is refused there; run as
oneself it needs no privilege."""
from __future__ import annotations


def test_doctor_python_is_refused_under_sudo_without_touching_the_path(make_user, memprof_as_root, canaries):
    user = make_user()
    for path in ("/dev/kmsg", str(canaries.script), str(canaries.absent)):
        result = memprof_as_root(user, "doctor", "--python", path, cwd=user.home)
        assert result.returncode == 2, result.stderr
        assert "refused" in result.stderr and "without sudo" in result.stderr and "Traceback" not in result.stderr
        assert path not in result.stdout + result.stderr  # nothing said about what is there
    canaries.assert_untouched()
