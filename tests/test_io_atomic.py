"""The atomic writers' bytes and their clean-up (from the mutation run of ``fedrepro.io``,
docs/mutation.md): JSON outputs have one byte form for one object (the "same seed, same bits"
promise is checked on these files), every writer round-trips and leaves no temporary, a killed
writer's temporary is removed by the next write of that output (and nothing else is), and a write
failure becomes an :class:`OutputError` naming the output while other errors pass through.  And
the readers: line ends, a byte-order mark, blank lines, and errors naming file, line and column."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from fedrepro import io as fio
from fedrepro.io import InputError, OutputError


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_json_and_jsonl_have_one_byte_form(tmp_path):
    fio.write_json_atomic(tmp_path / "a.json", {"b": 1, "a": "é", "c": [1, {"z": 0, "y": 2}]})
    assert (tmp_path / "a.json").read_bytes() == (
        '{\n  "a": "é",\n  "b": 1,\n  "c": [\n    1,\n    {\n      "y": 2,\n      "z": 0\n    }\n  ]\n}\n'
    ).encode("utf-8")
    n = fio.write_jsonl_atomic(tmp_path / "a.jsonl", iter([{"b": 1, "a": "é"}, {"c": "中"}]))
    assert n == 2
    assert (tmp_path / "a.jsonl").read_bytes() == '{"a": "é", "b": 1}\n{"c": "中"}\n'.encode("utf-8")
    assert fio.write_jsonl_atomic(tmp_path / "empty.jsonl", []) == 0
    assert (tmp_path / "empty.jsonl").read_bytes() == b""
    fio.write_text_atomic(tmp_path / "t.txt", "温度 37℃\n")
    assert (tmp_path / "t.txt").read_bytes() == "温度 37℃\n".encode("utf-8")
    assert _leftovers(tmp_path) == []


def test_text_outputs_are_utf8_under_a_c_locale(tmp_path):
    """A cluster node with ``LANG=C`` (and Python's UTF-8 mode off): the locale's encoding is
    ASCII, yet the outputs are UTF-8 -- the writers name their encoding."""
    import subprocess
    import sys

    code = (
        "import locale, sys\n"
        "from fedrepro import io as fio\n"
        "if locale.getpreferredencoding(False).lower() not in ('ansi_x3.4-1968', 'ascii', 'us-ascii'):\n"
        "    sys.exit(3)\n"
        "d = sys.argv[1]\n"
        "fio.write_json_atomic(d + '/a.json', {'a': '\\u00e9'})\n"  # é, 中, ℃ (an ASCII command line)
        "fio.write_jsonl_atomic(d + '/a.jsonl', [{'a': '\\u4e2d'}])\n"
        "fio.write_text_atomic(d + '/a.txt', '\\u2103')\n"
    )
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True,
                          cwd=Path.cwd(), timeout=120)
    if done.returncode == 3:
        pytest.skip("LC_ALL=C does not give an ASCII locale encoding on this system")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "a.json").read_bytes() == '{\n  "a": "é"\n}\n'.encode("utf-8")
    assert (tmp_path / "a.jsonl").read_bytes() == '{"a": "中"}\n'.encode("utf-8")
    assert (tmp_path / "a.txt").read_bytes() == "℃".encode("utf-8")


def test_binary_writers_round_trip(tmp_path):
    from safetensors.numpy import load_file as load_np
    from safetensors.torch import load_file as load_torch

    fio.write_bytes_atomic(tmp_path / "b.bin", memoryview(b"\x00\x01\xff"))
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01\xff"
    obj = {"w": torch.arange(6.0).reshape(2, 3), "step": 3}
    fio.torch_save_atomic(obj, tmp_path / "s.pt")
    got = torch.load(tmp_path / "s.pt", weights_only=True)
    assert got["step"] == 3 and torch.equal(got["w"], obj["w"])
    # the same object gives the same bytes (the archive's inner folder is not the temporary's name)
    first = (tmp_path / "s.pt").read_bytes()
    fio.torch_save_atomic(obj, tmp_path / "s.pt")
    assert (tmp_path / "s.pt").read_bytes() == first
    fio.safetensors_save_atomic({"x": torch.ones(2, dtype=torch.bfloat16)}, tmp_path / "t.safetensors")
    assert torch.equal(load_torch(tmp_path / "t.safetensors")["x"], torch.ones(2, dtype=torch.bfloat16))
    arrays = {"y": np.arange(3, dtype=np.int64)}
    fio.safetensors_save_atomic(arrays, tmp_path / "n.safetensors")
    assert np.array_equal(load_np(tmp_path / "n.safetensors")["y"], arrays["y"])
    assert _leftovers(tmp_path) == []


def test_a_killed_writer_s_temporaries_are_removed_by_the_next_write_and_nothing_else(tmp_path):
    stale = [f".out.json.{i:02d}abcd_x.tmp" for i in range(8)]  # tempfile's 8 characters [a-z0-9_]
    kept = ([f".out.json.{i:02d}ABCD_X.tmp" for i in range(8)]  # not tempfile's alphabet
            + [".out.json.abc.tmp", ".out.json.abcd12345.tmp",  # wrong length
               ".out.json.abcd1234.bak", ".other.json.abcd1234.tmp"])  # another suffix / output
    for name in stale + kept:
        (tmp_path / name).write_text("partial")
    (tmp_path / ".out.json.dirxxxxx.tmp").mkdir()  # a folder of that pattern: not a file writer's
    (tmp_path / "target").write_text("keep me")
    (tmp_path / ".out.json.linkxxxx.tmp").symlink_to(tmp_path / "target")  # never followed or removed
    fio.write_json_atomic(tmp_path / "out.json", {})
    left = _leftovers(tmp_path)
    assert not set(stale) & set(left)
    assert set(kept) | {".out.json.dirxxxxx.tmp", ".out.json.linkxxxx.tmp"} == set(left)
    assert (tmp_path / "target").read_text() == "keep me"
    # a folder writer removes stale folders of its name, not files
    (tmp_path / ".d.abcd1234").mkdir()
    (tmp_path / ".d.abcd1234" / "x").write_text("partial")
    (tmp_path / ".d.efgh5678").write_text("a file")
    with fio.atomic_dir(tmp_path / "d") as tmp:
        (tmp / "f").write_text("done")
    assert (tmp_path / "d" / "f").read_text() == "done"
    assert not (tmp_path / ".d.abcd1234").exists() and (tmp_path / ".d.efgh5678").exists()


def test_a_write_failure_names_the_output_and_what_to_do(tmp_path):
    out = tmp_path / "sub" / "r.json"
    with pytest.raises(OutputError) as err:
        with fio.atomic_path(out):
            raise OSError(errno.ENOSPC, "No space left on device")  # write() errors name no file
    e = err.value
    assert e.errno == errno.ENOSPC and e.filename == str(out)
    assert str(out) in str(e) and "(No space left on device)" in str(e) and f"free disk space ({out.parent})" in str(e)
    assert not out.exists() and _leftovers(out.parent) == []
    with pytest.raises(OutputError, match=r"\(Input/output error\); .* -- check the folder"):
        with fio.atomic_path(out):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
    # the temporary itself named: still the output's failure
    with pytest.raises(OutputError, match="make the folder writable"):
        with fio.atomic_path(out) as tmp:
            raise PermissionError(errno.EACCES, "Permission denied", str(tmp))


def test_other_errors_inside_the_block_pass_through(tmp_path):
    out = tmp_path / "r.json"
    other = tmp_path / "input.jsonl"
    # a write-side errno on another path (reading an input on a read-only disk): not this output's
    with pytest.raises(PermissionError) as err:
        with fio.atomic_path(out):
            raise PermissionError(errno.EACCES, "Permission denied", str(other))
    assert not isinstance(err.value, OutputError)
    with pytest.raises(FileNotFoundError):  # not a write errno
        with fio.atomic_path(out):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")
    assert not out.exists() and _leftovers(tmp_path) == []


def test_an_output_error_inside_a_folder_writer_names_the_folder(tmp_path):
    inner = OutputError(errno.ENOSPC, "inner message", "x")
    # a file writer passes an OutputError on unchanged
    with pytest.raises(OutputError) as err:
        with fio.atomic_path(tmp_path / "f.json"):
            raise inner
    assert err.value is inner
    # a folder writer names itself, with the errno's own words
    with pytest.raises(OutputError) as err:
        with fio.atomic_dir(tmp_path / "clients"):
            raise inner
    assert err.value is not inner and err.value.filename == str(tmp_path / "clients")
    assert "(No space left on device)" in str(err.value) and "inner message" not in str(err.value)
    assert not (tmp_path / "clients").exists() and _leftovers(tmp_path) == []


# -- reading ---------------------------------------------------------------------------------
def test_lines_lose_their_end_and_a_leading_bom_only(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(b"\xef\xbb\xbffirst\r\n\rsecond\n\nlast")
    assert list(fio.iter_text_lines(f)) == [(1, "first"), (2, "\rsecond"), (3, ""), (4, "last")]
    assert [line for _, line in fio.iter_text_lines(f, keepends=True)] == ["first\r\n", "\rsecond\n", "\n", "last"]
    assert fio.read_text(f) == "first\r\n\rsecond\n\nlast"
    g = tmp_path / "bom_last.txt"
    g.write_bytes(b"x\xef\xbb\xbf")  # a BOM elsewhere is text
    assert fio.read_text(g) == "x\ufeff"


def test_bad_bytes_are_named_by_line_and_column(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(b"ok\na\nab\xffc\n")
    with pytest.raises(InputError, match=r"t.txt:3: not valid UTF-8 text \(byte 0xff at column 3"):
        fio.read_text(f)
    with pytest.raises(InputError, match=r"t.txt:3: not valid UTF-8 text \(byte 0xff at column 3"):
        list(fio.iter_text_lines(f))
    f.write_bytes(b"\nx\xff")  # the line break right at the start of the file
    with pytest.raises(InputError, match=r":2: not valid UTF-8 text \(byte 0xff at column 2"):
        fio.read_text(f)


def test_jsonl_skips_blank_lines_and_names_what_it_expected(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text('{"a": 1}\n\n   \n{"a": 2}\n')
    assert fio.read_jsonl(f) == [{"a": 1}, {"a": 2}]
    assert [n for n, _ in fio.iter_jsonl(f)] == [1, 4]
    f.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(InputError, match=r"r.jsonl:2: expected a JSON object, got list"):
        fio.read_jsonl(f)


def test_read_json_names_the_file_and_line(tmp_path):
    f = tmp_path / "c.json"
    f.write_text('{"a": 1}')
    assert fio.read_json(str(f)) == {"a": 1}
    f.write_text('{\n  "a": 1,\n}\n')
    with pytest.raises(InputError, match=r"c.json:3: not valid JSON"):
        fio.read_json(f)
    with pytest.raises(InputError, match="file not found"):
        fio.read_json(tmp_path / "missing.json")
