"""Curation and fingerprints on Apache Beam (DirectRunner, 2 worker processes) equal the local run.

Needs the beam extra: `make test` runs this file a second time with .beam/ on PYTHONPATH (see the
Makefile); without apache_beam it skips.
"""

import gzip
import json
import os

import numpy as np
import pytest

pytest.importorskip("apache_beam", reason="the beam extra is not installed (make test adds it)")

from rossjax.curate import (  # noqa: E402
    beam as curate_beam,  # noqa: E402
    beam_select,
    pipeline,
    subset,
)
from rossjax.curate.compiled import compiled_paths, read_compiled  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(REPO, "data", "rollouts", "sample.jsonl")
BEAM_ARGS = "--runner=DirectRunner --direct_num_workers=2 --direct_running_mode=multi_processing"


def _config(name, *args):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "configs", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(*args)


def _cfg(input_path, output, **kw):
    cfg = _config("curate")
    cfg.input, cfg.output, cfg.progress, cfg.beam_args = str(input_path), str(output), False, BEAM_ARGS
    cfg.update(kw)
    return cfg


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return sorted(f, key=lambda line: json.loads(line)["row"])


def assert_same_curation(local, beam):
    """Same examples in the same shards and order, same lists (beam writes them in row order;
    the local run in row order per stage within a chunk), same report but config and timing."""
    assert [os.path.basename(p) for p in compiled_paths(local)] == \
        [os.path.basename(p) for p in compiled_paths(beam)]
    a, b = list(read_compiled(local)), list(read_compiled(beam))
    assert [e["id"] for e in a] == [e["id"] for e in b]
    for x, y in zip(a, b):
        for k in ("input_ids", "loss_mask", "eligible_mask"):
            np.testing.assert_array_equal(x[k], y[k], err_msg=f"{x['id']} {k}")
        assert (x["provenance"], x["turn_spans"]) == (y["provenance"], y["turn_spans"])
    for name in ("withheld.jsonl", "invalid.jsonl"):
        assert _lines(os.path.join(local, name)) == _lines(os.path.join(beam, name)), name
    ra, rb = (json.load(open(os.path.join(d, "report.json"))) for d in (local, beam))
    for r in (ra, rb):
        for k in ("config", "elapsed_s", "rows_per_s"):
            r.pop(k)
    # the local run names this machine's sandbox layers; Beam's workers decide theirs
    sandbox_local, sandbox_beam = ra["verify"].pop("sandbox"), rb["verify"].pop("sandbox")
    assert sandbox_beam == (None if sandbox_local is None else
                            "unknown (verdicts ran on the Beam workers)")
    assert ra == rb
    assert not [n for n in os.listdir(beam) if n.startswith(".") or ".tmp" in n]
    return ra


def test_sample_equals_local(tmp_path):
    local = pipeline.curate(_cfg(SAMPLE, tmp_path / "local"))
    curate_beam.curate(_cfg(SAMPLE, tmp_path / "beam", runner="beam"))
    report = assert_same_curation(tmp_path / "local", tmp_path / "beam")
    assert report["buckets"] == local["buckets"] and report["buckets"]["kept"] > 0
    assert report["verify"]["rerun"] > 0  # verifiers ran inside the Beam workers


def test_cli_runner_beam_equals_local(tmp_path):
    """`rossjax curate --config.runner=beam` through the command line, as the README shows it."""
    from rossjax.cli import main as dispatch

    base = [f"--config={os.path.join(REPO, 'configs', 'curate.py')}", f"--config.input={SAMPLE}",
            "--config.progress=False"]
    assert dispatch(["curate", *base, f"--config.output={tmp_path / 'local'}"]) == 0
    assert dispatch(["curate", *base, f"--config.output={tmp_path / 'beam'}",
                     "--config.runner=beam", f"--config.beam_args={BEAM_ARGS}"]) == 0
    report = assert_same_curation(tmp_path / "local", tmp_path / "beam")
    assert report["buckets"]["kept"] > 0 and report["verify"]["rerun"] > 0


def test_files_glob_gz_and_rows_across_files(tmp_path):
    """Two files through a glob (.jsonl then .jsonl.gz): rows count on across files, reasons
    name each file, as in the local run; small shards so several are written."""
    lines = open(SAMPLE, encoding="utf-8").read().splitlines(keepends=True)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(lines[:13]), encoding="utf-8")
    with gzip.open(tmp_path / "in" / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("\n" + "".join(lines[13:]))  # a blank line: rows stay line numbers
    kw = dict(verify="stored", unverified="keep", examples_per_shard=4)
    pipeline.curate(_cfg(tmp_path / "in" / "*", tmp_path / "local", **kw))
    curate_beam.curate(_cfg(tmp_path / "in" / "*", tmp_path / "beam", runner="beam", **kw))
    report = assert_same_curation(tmp_path / "local", tmp_path / "beam")
    assert len(report["shards"]) > 2
    invalid = _lines(tmp_path / "beam" / "invalid.jsonl")
    assert any("b.jsonl.gz row" in line for line in invalid)


# Beam's job service thread raises when it sees the worker exit: expected here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_worker_crash_mid_bundle_is_retried(tmp_path, monkeypatch, capfd):
    """A row kills its Beam worker process once (os._exit, no exception): the run is retried
    into the same files, with no row lost or counted twice."""
    marker = tmp_path / "crashed"
    monkeypatch.setenv(curate_beam.CRASH_ENV, f"{marker}:17")
    kw = dict(verify="stored", unverified="keep")
    pipeline.curate(_cfg(SAMPLE, tmp_path / "local", **kw))
    curate_beam.curate(_cfg(SAMPLE, tmp_path / "beam", runner="beam", **kw))
    assert marker.exists()
    assert "beam run 1 failed" in capfd.readouterr().err
    report = assert_same_curation(tmp_path / "local", tmp_path / "beam")
    assert report["input_rows"] == 30


OK = {"name": "math", "passed": True}
POSITIVE = dict(rows="verifier_positive", mask_mode="eligible", verify="stored", unverified="keep")


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_duplicate_ids_and_trl_rows_equal_local(tmp_path):
    """Ids repeated within and across files, and TRL rows without ids (their ids derived from
    content, two of them identical): the same rows are withheld as duplicate_id, first row kept,
    though the repeats land in other bundles than their first row."""
    sample = []
    for line in open(SAMPLE, encoding="utf-8"):
        try:
            sample.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # the sample's one line that is not JSON
    trl = [{"prompt": f"{i}+1?", "completion": f"{i + 1}", "verifier": OK} for i in range(3)]
    trl.append({"messages": [{"role": "user", "content": "2+2?"},
                             {"role": "assistant", "content": "4"}], "verifier": OK})
    (tmp_path / "in").mkdir()
    _write(tmp_path / "in" / "a.jsonl", sample[:12] + trl + [trl[1]] + sample[3:5])
    _write(tmp_path / "in" / "b.jsonl", sample[10:] + [sample[0], trl[0], trl[3]] + sample[:2])
    kw = dict(POSITIVE, chunk_rows=8)  # local chunks of 8: repeats span chunks there too
    pipeline.curate(_cfg(tmp_path / "in", tmp_path / "local", **kw))
    curate_beam.curate(_cfg(tmp_path / "in", tmp_path / "beam", runner="beam", **kw))
    report = assert_same_curation(tmp_path / "local", tmp_path / "beam")
    assert report["ids"]["derived"] == 7
    assert report["ids"]["duplicate"] == report["reasons"]["withheld"]["duplicate_id"] == 10
    ids = [e["id"] for e in read_compiled(tmp_path / "beam")]
    assert len(ids) == len(set(ids)) and sum(i.startswith("sha-") for i in ids) == 4


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}}}}]
# A chat template that shows its tools and its enable_thinking kwarg in the rendered text.
TEMPLATE = ("{%- if tools %}{{- 'TOOLS:' + tools | length | string + '\\n' }}{%- endif %}"
            "{%- if enable_thinking is false %}{{- 'NO-THINK\\n' }}{%- endif %}"
            "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
            "{%- if m.role == 'assistant' %}{% generation %}{{- m.content + '<|im_end|>' }}"
            "{% endgeneration %}{{- '\\n' }}{%- else %}{{- m.content + '<|im_end|>\\n' }}"
            "{%- endif %}{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def _byte_tokenizer(path) -> str:
    """A Hugging Face tokenizer folder: byte-level tokens, ChatML specials, TEMPLATE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from rossjax.tokenizers.base import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": TEMPLATE}))
    return str(path)


def test_field_mapping_template_kwargs_and_tools_equal_local(tmp_path):
    """config.fields maps other columns (id, reward with a threshold); the tokenizer's template
    gets config.template_kwargs and each row's tools, in the Beam workers as in the local run."""
    from rossjax.tokenizers import load_tokenizer

    rows = [{"q": f"{i}+1?", "a": f"{i + 1}", "r": 0.9 if i % 3 else 0.1, "uid": i}
            for i in range(20)]
    rows[4]["tools"] = TOOLS
    rows[7].pop("r")  # no reward: invalid, naming config.fields.reward_key
    rows[9]["uid"] = 2  # a repeated id through the mapping
    _write(tmp_path / "m.jsonl", rows)
    kw = dict(POSITIVE, tokenizer=_byte_tokenizer(tmp_path / "tok"), template="tokenizer",
              template_kwargs='{"enable_thinking": false}',
              fields=dict(input_key="q", label_key="a", reward_key="r", reward_threshold=0.5,
                          id_key="uid"))
    pipeline.curate(_cfg(tmp_path / "m.jsonl", tmp_path / "local", **kw))
    curate_beam.curate(_cfg(tmp_path / "m.jsonl", tmp_path / "beam", runner="beam", **kw))
    report = assert_same_curation(tmp_path / "local", tmp_path / "beam")
    assert report["buckets"] == {"kept": 12, "withheld": 7, "invalid": 1}
    assert report["reasons"]["withheld"] == {"duplicate_id": 1, "verifier_failed": 6}
    tok = load_tokenizer(kw["tokenizer"])
    texts = {e["id"]: tok.decode(e["input_ids"].tolist()) for e in read_compiled(tmp_path / "beam")}
    assert texts["1"].startswith("NO-THINK\n<|im_start|>user\n1+1?")
    assert texts["4"].startswith("TOOLS:1\nNO-THINK\n")


def test_outputs_staged_and_kept_nothing_exits(tmp_path):
    """The Beam run writes into DIR/.partial and moves into DIR at the end, replacing the last
    run's files; a run that keeps no row is the local run's one sentence (the CLI's exit 2)."""
    from rossjax.errors import InputError

    out = tmp_path / "out"
    kw = dict(POSITIVE, beam_args="--runner=DirectRunner")
    curate_beam.curate(_cfg(SAMPLE, out, runner="beam", examples_per_shard=4, **kw))
    assert len(compiled_paths(out)) > 2 and not (out / ".partial").exists()
    cfg = _cfg(SAMPLE, out, runner="beam", max_length=3, **kw)
    with pytest.raises(InputError, match="none of the 30 rows was kept: .* withheld as too_long"):
        pipeline.finish(cfg, curate_beam.curate(cfg), str(out))
    assert compiled_paths(out) == [] and sorted(os.listdir(out)) == [
        "invalid.jsonl", "report.json", "run.lock", "withheld.jsonl"]  # the lock stays (issue 36)
    assert json.load(open(out / "report.json"))["buckets"]["kept"] == 0


def _synthetic_pool(dir_, n: int) -> str:
    """n rows cycling through the sample (invalid lines included), fresh ids, mostly stored
    verdicts (passed, failed, undecided) and some math rows left for the verifier; three files:
    .jsonl, .jsonl.gz and .parquet (valid rows only)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = open(SAMPLE, encoding="utf-8").read().splitlines()
    out, parquet = [], []
    for k in range(n):
        line = base[k % len(base)]
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            out.append(line)
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("id"), str):
            out.append(line)
            continue
        rec["id"] = f"{rec['id']}-{k}"
        domain = (rec.get("task") or {}).get("domain")
        if "verifier" not in rec and not (domain == "math" and k % 97 == 0):
            rec["verifier"] = {"name": domain or "math", "evidence": "stored",
                               "passed": None if k % 31 == 0 else k % 7 != 0}
        if k >= n * 5 // 6 and domain == "math" and rec.get("verifier"):
            parquet.append(rec)
        else:
            out.append(json.dumps(rec))
    third = len(out) // 2
    (dir_ / "pool-0.jsonl").write_text("\n".join(out[:third]) + "\n", encoding="utf-8")
    with gzip.open(dir_ / "pool-1.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(out[third:]) + "\n")
    pq.write_table(pa.Table.from_pylist(parquet), dir_ / "pool-2.parquet")
    return str(dir_ / "pool-*")


@pytest.mark.slow
def test_pool_20k_equals_local(tmp_path):
    (tmp_path / "in").mkdir()
    pattern = _synthetic_pool(tmp_path / "in", 20000)
    kw = dict(examples_per_shard=5000, chunk_rows=2048)
    pipeline.curate(_cfg(pattern, tmp_path / "local", **kw))
    curate_beam.curate(_cfg(pattern, tmp_path / "beam", runner="beam", **kw))
    report = assert_same_curation(tmp_path / "local", tmp_path / "beam")
    assert report["input_rows"] == 20000 and len(report["shards"]) >= 2
    assert report["verify"]["rerun"] > 0 and report["buckets"]["invalid"] > 0


def test_select_fingerprints_equal_local(tmp_path):
    cfg = _config("select_routes", "runlocal")
    cfg.plot, cfg.progress, cfg.beam_args = False, False, BEAM_ARGS
    local = subset.run(cfg, str(tmp_path / "local"))
    beam = subset.run(cfg, str(tmp_path / "beam"), fingerprinter=beam_select.fingerprinter)
    assert os.listdir(tmp_path / "beam" / "fingerprints")  # the shard set
    for r in (local, beam):
        r.pop("output")
    assert local == beam
    # and the vectors themselves, against the local streaming pass
    meta = subset.PoolMeta(cfg.group_by)
    from rossjax.routes.fingerprint import fingerprint_many

    fps, routes = fingerprint_many(subset.stream_pool(cfg.input, meta), cfg.domain, cfg.dim,
                                   cfg.seed)
    bfps, broutes, bmeta = beam_select.read_fingerprint_shards(
        str(tmp_path / "beam" / "fingerprints"), cfg.group_by)
    np.testing.assert_array_equal(fps, bfps)
    np.testing.assert_array_equal(routes, broutes)
    assert (meta.rows, meta.ids, meta.groups, meta.skipped) == \
        (bmeta.rows, bmeta.ids, bmeta.groups, bmeta.skipped)


@pytest.mark.slow
def test_bench_beam_line(capsys):
    from rossjax.bench.curate import bench_beam

    bench_beam(40, 300, 2, "qwen")
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("beam: 40 rollouts") and "rows/s" in line and line.endswith("True")
