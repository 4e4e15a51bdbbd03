"""make_model reuses an output folder whose manifest matches the preset, seed and options, and
regenerates anything else (sglang.testing.make_model / model_manifest)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from sglang.testing import make_model as mm
from sglang.testing import model_manifest
from sglang.testing.presets import get_preset

TINY = "qwen3-vl-tiny"
SHARD_LIMIT = 4_000_000  # forces several shards for the tiny preset (float32)


def _hashes(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


def _stats(d: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(d.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The sharded tiny model, made once; tests copy or compare against it."""
    return mm.make_model(TINY, tmp_path_factory.mktemp("ref") / "m", max_shard_bytes=SHARD_LIMIT, progress=False)


@pytest.fixture
def made(tmp_path) -> Path:
    return mm.make_model(TINY, tmp_path / "m", max_shard_bytes=SHARD_LIMIT, progress=False)


@pytest.fixture
def write_calls(monkeypatch) -> list:
    """Counts weight generations (the slow path)."""
    calls: list = []
    real = mm._write_weights

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(mm, "_write_weights", spy)
    return calls


def _shards(d: Path) -> list[Path]:
    return sorted(d.glob("model-*-of-*.safetensors"))


# ----------------------------------------------------------------------------- reuse


def test_second_call_reuses_without_writing(made, reference, monkeypatch, capsys):
    assert len(_shards(made)) >= 3
    assert _hashes(made) == _hashes(reference)
    before = _stats(made)

    def must_not_run(*a, **k):
        raise AssertionError("regenerated a complete folder")

    monkeypatch.setattr(mm, "_write_weights", must_not_run)
    r = mm.build_model(TINY, made, max_shard_bytes=SHARD_LIMIT, progress=False)
    assert r.reused and r.reason == "" and r.path == made
    assert mm.make_model(TINY, made, max_shard_bytes=SHARD_LIMIT, progress=False, threads=1) == made
    assert mm.main(["--preset", TINY, "--out", str(made), "--max-shard-bytes", str(SHARD_LIMIT)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"reused {made} ") and "seed 0" in lines[0], lines
    assert _stats(made) == before  # not a byte rewritten, mtimes included


def test_manifest_is_written_last_and_describes_the_folder(made):
    m = model_manifest.read(made)
    assert m["preset"] == TINY and m["seed"] == 0 and m["dtype"] == "float32"
    assert m["generator_version"] == mm.GENERATOR_VERSION and m["max_shard_bytes"] == SHARD_LIMIT
    assert m["manifest_hash"] == model_manifest.manifest_hash(m)
    on_disk = {p.name for p in made.iterdir() if p.is_file()} - {mm.MANIFEST_FILE}
    assert set(m["files"]) == on_disk
    for name, entry in m["files"].items():
        assert entry["size"] == (made / name).stat().st_size
        assert ("sha256" in entry) == (not name.endswith(".safetensors"))
    manifest_mtime = (made / mm.MANIFEST_FILE).stat().st_mtime_ns
    assert all(p.stat().st_mtime_ns <= manifest_mtime for p in made.iterdir())


@pytest.mark.parametrize(
    "change, kwargs",
    [("seed", {"seed": 1}), ("dtype", {"dtype": "bfloat16"}), ("max_shard_bytes", {"max_shard_bytes": 10**9})],
)
def test_changed_option_regenerates(made, write_calls, change, kwargs):
    args = {"max_shard_bytes": SHARD_LIMIT, **kwargs}
    r = mm.build_model(TINY, made, progress=False, **args)
    assert not r.reused and change in r.reason and len(write_calls) == 1
    m = model_manifest.read(made)
    assert m[change] == args[change]
    if change == "max_shard_bytes":
        assert not _shards(made) and (made / "model.safetensors").is_file()  # stale shards removed
    # and the new folder is reused in turn
    assert mm.build_model(TINY, made, progress=False, **args).reused and len(write_calls) == 1


def test_changed_preset_definition_regenerates(made, write_calls):
    from sglang.testing.presets import with_overrides

    other = with_overrides(TINY, init=get_preset(TINY).init.__class__(weight_std=0.25))
    r = mm.build_model(other, made, max_shard_bytes=SHARD_LIMIT, progress=False)
    assert not r.reused and "preset_digest" in r.reason and len(write_calls) == 1


def _delete_shard(d: Path):
    _shards(d)[1].unlink()


def _truncate_shard(d: Path):
    s = _shards(d)[-1]
    s.write_bytes(s.read_bytes()[:-8])


def _no_manifest(d: Path):
    (d / mm.MANIFEST_FILE).unlink()


def _edit_config(d: Path):
    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"]["num_hidden_layers"] = 1
    (d / "config.json").write_text(json.dumps(cfg, indent=2))


def _tamper_manifest(d: Path):
    m = json.loads((d / mm.MANIFEST_FILE).read_text())
    m["seed"] = 7  # without fixing manifest_hash
    (d / mm.MANIFEST_FILE).write_text(json.dumps(m))


def _extra_shard(d: Path):
    (d / "model-00099-of-00099.safetensors").write_bytes(b"stale")


def _older_generator(d: Path):
    m = json.loads((d / mm.MANIFEST_FILE).read_text())
    m["generator_version"] = mm.GENERATOR_VERSION - 1
    m["manifest_hash"] = model_manifest.manifest_hash(m)
    (d / mm.MANIFEST_FILE).write_text(json.dumps(m))


@pytest.mark.parametrize(
    "damage",
    [_delete_shard, _truncate_shard, _no_manifest, _edit_config, _tamper_manifest, _extra_shard, _older_generator],
    ids=lambda f: f.__name__.strip("_"),
)
def test_incomplete_or_changed_folder_regenerates(made, reference, write_calls, damage):
    damage(made)
    r = mm.build_model(TINY, made, max_shard_bytes=SHARD_LIMIT, progress=False)
    assert not r.reused and r.reason and len(write_calls) == 1
    assert _hashes(made) == _hashes(reference)


def test_killed_run_is_not_reused(made, reference, monkeypatch, write_calls):
    """A run that dies halfway (here: after the first shard) leaves no manifest, whatever was
    there before, so the next call regenerates instead of reusing a partial folder."""
    real = mm._write_safetensors
    written: list = []

    def dies_after_one_shard(path, *args, **kwargs):
        if written:
            raise KeyboardInterrupt
        written.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(mm, "_write_safetensors", dies_after_one_shard)
    with pytest.raises(KeyboardInterrupt):
        mm.build_model(TINY, made, max_shard_bytes=SHARD_LIMIT, progress=False, force=True)
    assert not (made / mm.MANIFEST_FILE).exists()
    assert model_manifest.check(made, mm._identity(get_preset(TINY), 0, "float32", SHARD_LIMIT))[0] is None

    monkeypatch.setattr(mm, "_write_safetensors", real)
    r = mm.build_model(TINY, made, max_shard_bytes=SHARD_LIMIT, progress=False)
    assert not r.reused and "manifest" in r.reason and len(write_calls) == 2
    assert _hashes(made) == _hashes(reference)
    assert not list(made.glob("*.partial"))


def test_force_regenerates(made, reference, write_calls, capsys):
    r = mm.build_model(TINY, made, max_shard_bytes=SHARD_LIMIT, progress=False, force=True)
    assert not r.reused and r.reason == "forced" and len(write_calls) == 1
    assert mm.main(["--preset", TINY, "--out", str(made), "--max-shard-bytes", str(SHARD_LIMIT),
                    "--force", "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {made} ") and "2 thread(s)" in out and len(write_calls) == 2
    assert _hashes(made) == _hashes(reference)
