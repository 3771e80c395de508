"""A PEP 517 backend that, while the environment is built, reads what it is told to and
bakes it into the wheel it builds."""

import base64
import hashlib
import os
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
DIST = "evilpkg-0.1.dist-info"


def _loot():
    try:
        with open(os.path.join(HERE, "target.txt")) as fh:
            target = fh.read().strip()
        with open(target) as fh:
            return fh.read()
    except OSError as exc:
        return f"refused: {exc.strerror}"


def _record(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = {
        "evilpkg_loot.py": f"LOOT = {_loot()!r}\n".encode(),
        f"{DIST}/METADATA": b"Metadata-Version: 2.1\nName: evilpkg\nVersion: 0.1\n",
        f"{DIST}/WHEEL": b"Wheel-Version: 1.0\nGenerator: evil\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    name = "evilpkg-0.1-py3-none-any.whl"
    record = [_record(k, v) for k, v in files.items()] + [f"{DIST}/RECORD,,"]
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as zf:
        for k, v in files.items():
            zf.writestr(k, v)
        zf.writestr(f"{DIST}/RECORD", "\n".join(record) + "\n")
    return name
