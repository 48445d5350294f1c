"""The advice framework (issue 22): the rule table is complete (every entry says its trigger,
evidence, advice and saving, with named thresholds), `advise` ranks advice by its saving, and
`report advice` prints each piece with its evidence, chains and thresholds, and says why every
other rule was silent. The rules themselves are tested in tests/unit/test_advice_<rule>.py."""
from __future__ import annotations

import io
import json
import re

from rich.console import Console

from memprof.analysis.advice import Advice, Rule, Threshold, advise, fired, silent
from memprof.analysis.advice.table import RULES
from memprof.analysis.views import About, AdviceView
from memprof.report import advice as advice_report
from tests.html_factories import leaky_recording
from tests.unit.test_html import invoke

ISSUE_RULES = {"autograd-graph-kept", "kv-cache", "attention-scores", "allocator-fragmentation",
               "activations-peak", "optimizer-state", "dataloader-copy-on-read", "memory-outside-pytorch"}
KEBAB = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def test_the_table_has_every_rule_of_the_issue_once():
    ids = [rule.id for rule in RULES]
    assert len(ids) == len(set(ids)) and set(ids) == ISSUE_RULES
    assert all(KEBAB.match(rule_id) for rule_id in ids)


def test_every_entry_says_its_trigger_evidence_advice_and_saving_with_named_thresholds():
    for rule in RULES:
        for field in ("title", "trigger", "evidence", "advice", "saving"):
            assert getattr(rule, field).strip(), f"{rule.id}: {field} is empty"
        assert rule.thresholds, f"{rule.id}: no named thresholds"
        names = [t.name for t in rule.thresholds]
        assert len(names) == len(set(names)), f"{rule.id}: a threshold name twice"
        for threshold in rule.thresholds:
            assert re.match(r"^[A-Z][A-Z0-9_]*$", threshold.name), threshold.name
            assert threshold.unit and threshold.meaning, threshold


# ---- advise, on rules of the test's own ----------------------------------------------------------

def _advice(rule: str, saving_bytes: int | None) -> Advice:
    return Advice(rule=rule, title=f"{rule} found", evidence=(f"{rule} evidence",), change="change it",
                  saving="less", saving_bytes=saving_bytes)


def _rule(rule_id: str, verdict) -> Rule:
    return Rule(id=rule_id, title=rule_id, trigger="t", evidence="e", advice="a", saving="s",
                thresholds=(Threshold("LIMIT", 1.0, "fraction", "what it means"),), check=lambda facts: verdict)


def test_advise_ranks_by_saving_and_keeps_advice_without_one_last_in_table_order():
    rules = (_rule("no-saving", fired(_advice("no-saving", None))),
             _rule("small", fired(_advice("small", 10))),
             _rule("quiet", silent("nothing grew")),
             _rule("big", fired(_advice("big", 1000), _advice("big", 5))))
    result = advise(facts=None, rules=rules)
    assert [(a.rule, a.saving_bytes) for a in result.advice] == [("big", 1000), ("small", 10), ("big", 5),
                                                                  ("no-saving", None)]
    assert [o.rule.id for o in result.outcomes] == ["no-saving", "small", "quiet", "big"]
    assert result.outcomes[2].verdict.why_not == "nothing grew" and not result.outcomes[2].verdict.advice


def _view() -> AdviceView:
    chains = {7: [{"kind": "python", "function": "forward", "file": "/src/model.py", "line": 42},
                  {"kind": "python", "function": "main", "file": "/src/train.py", "line": 9}]}
    found = Advice(rule="big", title="The cache dominates the peak", evidence=("48.0 KiB per token, R² 0.99",),
                   change="use a quantized cache", saving="3/4 of the cache at the peak", saving_bytes=3 * 2**20,
                   chains=(7, None), modules=("transformer.h.0.attn",), layer="torch_cpu", device="cpu",
                   numbers={"bytes_per_token": 49152})
    result = advise(facts=None, rules=(_rule("big", fired(found)), _rule("quiet", silent("no optimizer state"))))
    return AdviceView(result, About("run.memprof"), chains)


def test_json_gives_each_advice_with_chains_and_thresholds_and_every_rule_with_why_not():
    data = advice_report.to_json(_view())
    json.dumps(data)  # JSON-ready
    [given] = data["advice"]
    assert given["rule"] == "big" and given["saving_bytes"] == 3 * 2**20
    assert [c["name"] for c in given["chains"]] == ["forward (model.py:42) ← main (train.py:9)", "(no stack recorded)"]
    assert given["modules"] == ["transformer.h.0.attn"] and given["numbers"] == {"bytes_per_token": 49152}
    assert given["thresholds"] == [{"name": "LIMIT", "value": 1.0, "unit": "fraction", "meaning": "what it means"}]
    assert [(r["id"], r["fired"], r["why_not"]) for r in data["rules"]] == [("big", True, None),
                                                                           ("quiet", False, "no optimizer state")]


def test_the_terminal_prints_evidence_chain_change_saving_thresholds_and_the_silent_rules():
    console = Console(file=io.StringIO(), width=120, color_system=None)
    advice_report.render(_view(), console)
    text = console.file.getvalue()
    for expected in ("1. The cache dominates the peak  (big)", "48.0 KiB per token, R² 0.99",
                     "chain: forward (model.py:42) ← main (train.py:9)", "module: transformer.h.0.attn",
                     "try: use a quantized cache", "saving: 3/4 of the cache at the peak (3.0 MiB)",
                     "thresholds: LIMIT = 1 fraction (what it means)", "quiet: no optimizer state"):
        assert expected in text, (expected, text)


def test_a_saving_whose_words_give_its_figure_is_not_followed_by_it_again():
    """"…, 30.7 MiB if it is float32 (20.5 MiB)" read as if float32 saved 20.5 MiB."""
    view = _view()
    (found,) = view.result.advice
    words = Advice(**{**found.__dict__, "saving": "at least 3.0 MiB less at the peak, 4.5 MiB if it is float32"})
    console = Console(file=io.StringIO(), width=200, color_system=None)
    advice_report.render_advice(words, view.chains, (), console, 1)
    assert "saving: at least 3.0 MiB less at the peak, 4.5 MiB if it is float32\n" in console.file.getvalue()


def test_report_advice_on_a_recording_lists_every_rule_and_exits_0(tmp_path):
    path = leaky_recording(tmp_path / "leak.memprof")
    code, stdout, err = invoke("report", "advice", path, "--format", "json")
    assert code == 0, err
    assert {rule["id"] for rule in json.loads(stdout)["rules"]} == ISSUE_RULES
    code, stdout, err = invoke("report", "advice", path)
    assert code == 0 and "Traceback" not in err
    assert invoke("report", "advice", tmp_path / "missing.memprof")[0] != 0
