"""The report opens with the answer: its first heading after the title is ``The answer``, its
numbers are headline_gaps.csv's, its sentences are the notebooks' own (text.headline_verdict,
budget_map.point_sentences and budget_fits.fit_sentences from the same tables), the parameter accounting comes last, and a study
without notebook 03 / 09 says which table is missing."""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import nbformat
import numpy as np
import pandas as pd
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from studylib.study.analysis.law import checks as law_checks
from studylib.study.comparisons.token_budget import law_roles, plane
from studylib.study.comparisons.token_budget import gaps as bm
from studylib.study.analysis import tables, text
from studylib.study.runner import report

SEEDS = (11, 12, 13)


def _headline(out):
    """headline_gaps.csv as notebook 03 writes it, from per-seed losses (the MoE ahead of
    dense_active by ~0.05, dense_total ahead of the MoE by ~0.02), and the frame it came from."""
    rng = np.random.default_rng(0)
    rows = []
    for s in SEEDS:
        base = 3.0 + rng.normal(0, 0.02)
        rows += [{"model": "dense_a", "seed": s, "best_val_loss": base + 0.05 + rng.normal(0, 0.004)},
                 {"model": "moe_x", "seed": s, "best_val_loss": base},
                 {"model": "dense_t", "seed": s, "best_val_loss": base - 0.02 + rng.normal(0, 0.002)}]
    g = tables.headline_gaps(pd.DataFrame(rows), "dense_a", "moe_x", "dense_t")
    tables.relabel(g, {"active": "matched-active (dense_a - moe_x)", "total": "matched-total (moe_x - dense_t)"}) \
        .to_csv(out / "tables" / "headline_gaps.csv")
    for s in SEEDS:
        d = out / "runs" / "moe_x" / f"seed{s}"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"preset": "toy", "seed": s, "tokens": 40_000,
                                                    "device": "cpu", "wall_time_s": 2.5}))
    return g


def _map(out):
    rng = np.random.default_rng(1)
    rows = [{"size": "moe_x", "epochs": e, "seed": s, "gap": gap, "dense": 3.0 + d + rng.normal(0, 0.01), "moe": 3.0,
             "tokens": 1e4 * e, "tokens_per_param": 0.5 * e, "data_passes": 0.3 * e}
            for e in (0.5, 1.0, 2.0) for s in SEEDS for gap, d in (("active", 0.04 * e), ("total", -0.02))]
    per_seed = pd.DataFrame(rows).assign(value=lambda d: d["dense"] - d["moe"], stories=1.0,
                                         dense_bpb=lambda d: d["dense"] / 3.0, moe_bpb=lambda d: d["moe"] / 3.0,
                                         value_bpb=lambda d: d["dense_bpb"] - d["moe_bpb"])
    table = bm.gap_table(per_seed, {"moe_x": 20_000})
    table.to_csv(out / "tables" / "token_budget_gaps.csv", index=False)
    per_seed.to_csv(out / "tables" / "token_budget_per_seed.csv", index=False)
    models = plane.gap_models(per_seed, n_boot=200)
    fits = {"fit": plane.coefficient_table(models), "crossing": plane.crossing_table(models),
            "loo": plane.loo_table(per_seed, n_boot=200), "loss_law": pd.DataFrame(columns=["role"]),
            "extrapolation": law_roles.extrapolation_table(models, {})}
    for name, t in fits.items():
        t.to_csv(out / "tables" / f"token_budget_{name}.csv", index=False)
    return table, per_seed, fits


def _notebooks(out):
    nbs = []
    for name, body in (("01_budget_matching", "ACCOUNTING TABLE"), ("03_headline_sweep", "HEADLINE NOTEBOOK")):
        nb = new_notebook(cells=[new_markdown_cell(f"# {name}"), new_code_cell("x", outputs=[
            new_output("stream", name="stdout", text=body)])])
        nb.metadata["papermill"] = {"duration": 4.0}
        path = out / "notebooks" / f"{name}.ipynb"
        nbformat.write(nb, str(path))
        nbs.append(path)
    return nbs


@pytest.fixture
def out(tmp_path):
    o = tmp_path / "outputs" / "toy"
    for d in ("tables", "figures", "notebooks"):
        (o / d).mkdir(parents=True)
    return o


class _Text(HTMLParser):
    """The rendered text of the body, and its headings in order."""

    def __init__(self):
        super().__init__()
        self.parts, self.headings, self._h, self._skip = [], [], None, 0

    def handle_starttag(self, tag, attrs):
        if tag in ("style", "script"):
            self._skip += 1
        if re.fullmatch(r"h[1-6]", tag):
            self._h = []

    def handle_endtag(self, tag):
        if tag in ("style", "script"):
            self._skip -= 1
        if re.fullmatch(r"h[1-6]", tag) and self._h is not None:
            self.headings.append((tag, "".join(self._h).replace("¶", "").strip()))
            self._h = None

    def handle_data(self, data):
        if self._skip:
            return
        self.parts.append(data)
        if self._h is not None:
            self._h.append(data)


def _render(nbs, out):
    html = report.write_report(nbs, out / "report.html", title="Study toy").read_text()
    p = _Text()
    p.feed(html)
    return " ".join(" ".join(p.parts).split()), p.headings


def test_the_report_opens_with_the_answer(out):
    g = _headline(out)
    table, per_seed, fits = _map(out)
    nbs = _notebooks(out)
    body, headings = _render(nbs, out)
    assert headings[0] == ("h1", "Study toy") and headings[1] == ("h2", "The answer")
    answer = body[body.index("The answer"):body.index("Contents")]
    # the numbers are headline_gaps.csv's
    csv = pd.read_csv(out / "tables" / "headline_gaps.csv")
    for r in csv.itertuples():
        row = re.search(re.escape(r.comparison) + r" ([-+]\d\.\d{4}) \[([-+]\d\.\d{4}), ([-+]\d\.\d{4})\] (\d+)", answer)
        assert row, r.comparison
        assert [float(x) for x in row.groups()[:3]] == pytest.approx([r.mean, r.ci_low, r.ci_high], abs=5e-5)
        assert int(row.group(4)) == r.n == len(SEEDS)
    # the sentences are the notebooks' own, from the same numbers
    verdict = text.headline_verdict(g, "dense_a", "moe_x", "dense_t", "toy", 40_000)
    assert " ".join(verdict.split("What this does not show:")[0].split()) in answer
    assert "is reproduced" in answer  # this toy's gaps both resolve in the paper's direction
    words = [bm.point_sentences(table, gap) for gap in bm.GAPS] + (plane.plane_sentences(fits["fit"], fits["crossing"], fits["loo"])
                                                                      + law_roles.extrapolation_sentences(fits["extrapolation"]))
    assert len(words) == 2 + 2 + 2  # per gap: its points, its gap model; the extrapolation of each gap
    for s in words:
        assert " ".join(s.split()) in answer
    assert "What this does not show" in answer and "inconclusive gap is not evidence" in answer  # text.limits' words
    assert "Preset toy" in answer and "Seeds: 11, 12, 13" in answer and "CPU" in answer
    # then the contents and the notebooks, the parameter accounting last
    assert body.index("HEADLINE NOTEBOOK") < body.index("ACCOUNTING TABLE")
    assert body.index("Contents") < body.index("HEADLINE NOTEBOOK")


def test_without_the_tables_the_answer_names_what_is_missing(out):
    body, headings = _render(_notebooks(out), out)
    assert headings[1] == ("h2", "The answer")
    assert "Not computed: no tables/headline_gaps.csv (notebook 03" in body
    assert "Not computed: no tables/token_budget_gaps.csv (notebook 09" in body


def test_the_answer_gives_the_other_notebooks_families_in_their_words(out):
    """issue #31: each family table the study wrote is in the answer, worded as the notebook words it."""
    _headline(out)
    rng = np.random.default_rng(2)
    base = 3.0 + rng.normal(0, 0.02, 3)
    df = pd.DataFrame([{"model": m, "seed": s, "best_val_loss": v} for m, vals in
                       (("ref", base), ("top1", base + 0.2 + rng.normal(0, 0.01, 3)), ("top2", base + rng.normal(0, 0.003, 3)))
                       for s, v in zip(SEEDS, vals)])
    t = tables.comparison_table(df, {"top1": ("top1", "ref"), "top2": ("top2", "ref")}, family="02 routing ablation: x")
    t.to_csv(out / "tables" / "table1_gaps_vs_reference.csv")
    lines = report.family_sentences(out)
    assert lines == [f"Notebook 02: {text.comparison_sentences(t)}"]
    assert "Holm-corrected over 2" in lines[0] and "ref better than top1" in lines[0]
    body, _ = _render(_notebooks(out), out)
    assert "The other comparisons, one family per notebook" in body
    assert " ".join(lines[0].split()) in body


def _per_seed_losses(out, g):
    """table6_per_seed.csv as notebook 03 writes it (seed index; the trio's losses; both gaps)."""
    rng = np.random.default_rng(0)
    rows = {}
    for s in SEEDS:
        base = 3.0 + rng.normal(0, 0.02)
        rows[s] = {"dense_a": base + 0.05 + rng.normal(0, 0.004), "moe_x": base, "dense_t": base - 0.02}
    t = pd.DataFrame(rows).T
    t["active_gap"], t["total_gap"] = t["dense_a"] - t["moe_x"], t["moe_x"] - t["dense_t"]
    t.to_csv(out / "tables" / "table6_per_seed.csv")


def _law_paper(out):
    """token_budget_law_paper.csv from a joint law fitted to a two-size map drawn from a known law."""
    from studylib.study.analysis.law import fit as law_fit

    rng = np.random.default_rng(3)
    rows = []
    for size, n in (("s", 1e5), ("l", 4e5)):
        for tpp in (1.0, 4.0, 16.0):
            for role, (a, t) in {"dense_active": (n, n), "moe": (n, 1.4 * n), "dense_total": (1.4 * n, 1.4 * n)}.items():
                neff = a ** 0.4 * t ** 0.6
                mu = 0.8 + 30 / neff ** 0.33 + 30 / (tpp * n) ** 0.3
                rows += [{"role": role, "size": size, "seed": k, "active": a, "total": t, "tokens": tpp * n,
                          "unique": 5e6, "value": mu + rng.normal(0, 0.005)} for k in range(3)]
    j = law_fit.fit_law(pd.DataFrame(rows), n_boot=20, n_boot_cell=0)
    law_checks.paper_point(j).to_csv(out / "tables" / "token_budget_law_paper.csv", index=False)


def test_the_first_screen_is_one_table_short_sentences_and_the_key_figure(out):
    """issue #40: the answer ran 1,453 words before the contents; now the first screen (before the
    first <details>) is the question, one table, short sentences of at most 145 words together,
    and the key figure; everything else is folded below it (issue #55: one claim a sentence, in plain
    words, each at most 30 words)."""
    from studylib.study.comparisons import glance

    g = _headline(out)
    _per_seed_losses(out, g)
    _map(out)
    _law_paper(out)
    (out / "figures" / "token_budget_gaps.png").write_bytes(_PNG)
    html = report.write_report(_notebooks(out), out / "report.html", title="Study toy").read_text()
    start = html.index('id="The-answer"')
    first = html[start:html.index("<details", start)]
    p = _Text()
    p.feed(first)
    screen = " ".join(" ".join(p.parts).split())
    assert glance.words(screen) <= 300, glance.words(screen)
    assert first.count("<table") == 1 and "<img" in first  # the table and the key figure
    # the table's rows: the headline with the numbers of headline_gaps.csv, the paper, the map, the law
    rows = [r for r in re.findall(r"<tr>(.*?)</tr>", first, re.S)][1:]
    assert len(rows) == 4
    assert [re.sub("<[^>]+>", "", r).split()[0] for r in rows] == ["headline:", "paper:", "map:", "joint"]
    act = g.loc["active"]
    assert f"{act['mean']:+.4f} [{act['ci_low']:+.4f}, {act['ci_high']:+.4f}]" in rows[0]
    # the sentences: at most three, at most 145 words, the words the answer module builds
    answer_md = (out / "answer.md")
    assert not answer_md.exists()  # the runner writes it, not write_report
    report.write_answer(out)
    text_md = answer_md.read_text()
    lead = text_md.split("## For the README")[0].strip().split("\n\n")[-1]
    assert lead in screen.replace("−", "−")
    sentences = [s for s in re.split(r"(?<=\.) (?=[A-Z])", lead) if s]
    assert len(sentences) <= glance.MAX_SENTENCES and glance.words(lead) <= glance.MAX_WORDS
    assert max(glance.words(s) for s in sentences) <= glance.MAX_SENTENCE_WORDS  # short sentences, one claim each
    assert sentences[0].startswith("At ") and "ahead of the dense model with its active parameters" in sentences[0]
    assert sentences[1].startswith("It is behind the dense model with its total parameters: p = ")
    readme = text_md.split("## For the README (at most 150 words)")[1].strip()
    assert readme.startswith(lead) and glance.words(readme) <= glance.README_WORDS
    # everything else is below, folded
    rest = html[html.index("<details", start):html.index('id="Contents"')]
    assert "Headline (notebook 03)" in rest and "The token-budget map (notebook 09)" in rest


def _full(out):
    g = _headline(out)
    _per_seed_losses(out, g)
    _map(out)
    _law_paper(out)
    return g


def _controls(out):
    """Notebook 13's tables for one cell whose MoE is the headline's (controls_positions, _gaps,
    _twin) and Clark et al.'s trend read at it (clark_trend)."""
    from studylib.study.comparisons import controls as C
    from studylib.study.comparisons.controls import analysis as A
    from studylib.study.comparisons.controls.knobs import ControlCell

    rng = np.random.default_rng(3)
    base = {"dense_a": 3.05, "moe_x": 3.0, "dense_t": 2.98, "hash": 2.99, "frozen": 3.02, "one": 3.1, "twin": 3.1}
    s = pd.DataFrame([{"model": m, "seed": k, "best_val_loss": v + rng.normal(0, 0.002)}
                      for m, v in base.items() for k in SEEDS])
    cell = ControlCell(("dense_a", "moe_x", "dense_t"), (("hash", "hash"), ("frozen", "frozen"), ("one_expert", "one"),
                                                         ("dense_twin", "twin")), epochs=1.0)
    t = A.cell_tables([s], [cell], 0.03)
    t["positions"].to_csv(out / "tables" / f"{C.POSITIONS}.csv", index=False)
    t["gaps"].to_csv(out / "tables" / f"{C.GAPS}.csv")
    t["twin"].to_csv(out / "tables" / f"{C.TWIN}.csv")
    pd.DataFrame([{"router": "S-Base", "experts": 4, "size": "this study, moe_x (20k active)", "p": 0.4,
                   "ci_lo": 0.1, "ci_hi": 0.7, "decades_out": 2.4}]).to_csv(out / "tables" / "clark_trend.csv", index=False)


def test_the_controls_add_their_sentences_and_say_when_they_did_not_run(out):
    """issue #47: the first screen says what the controls show and where the MoE sits against
    Clark et al.'s trend; without notebook 13's tables the answer says it did not run."""
    from studylib.study.comparisons import glance

    _full(out)
    text_md = report.write_answer(out).read_text()
    lead = text_md.split("## For the README")[0].strip().split("\n\n")[-1]
    assert len(re.split(r"(?<=\.) (?=[A-Z])", lead)) == 4 and "Controls (" not in lead
    html = report.write_report(_notebooks(out), out / "report.html", title="Study toy").read_text()
    assert "Controls. Not computed: no tables/controls_positions.csv" in " ".join(re.sub("<[^>]+>", " ", html).split())
    _controls(out)
    text_md = report.write_answer(out).read_text()
    lead = text_md.split("## For the README")[0].strip().split("\n\n")[-1]
    sentences = re.split(r"(?<=\.) (?=[A-Z])", lead)
    assert len(sentences) == 6 and sentences[4].startswith("A router hashing the token id is as good as the learned")
    assert "and one frozen at its start trails it by" in sentences[4]
    assert sentences[5] == "One expert is as good as its dense twin (within ±0.03 nats)."
    # Clark et al.'s trend is below the first screen, in the controls' folded detail
    assert "Clark et al.'s learned routers" not in lead
    assert "extrapolated 2.4 decades down, trend to p = 0.40 [0.10, 0.70] here" in report.write_answer(out).read_text() \
        or "extrapolated 2.4 decades down" in " ".join(re.sub("<[^>]+>", " ", report.write_report(
            _notebooks(out), out / "report.html", title="Study toy").read_text()).split())
    readme = text_md.split("## For the README (at most 150 words)")[1].strip()
    assert glance.words(lead) <= glance.MAX_WORDS and glance.words(readme) <= glance.README_WORDS


def test_a_missing_table_under_the_answer_is_said_not_a_row_dropped(out):
    """issue #49: without token_budget_law_paper.csv answer.md (and the README's block) lost the
    joint law's row and sentence, exit 0, no line."""
    _full(out)
    (out / "tables" / "token_budget_law_paper.csv").unlink()
    (out / "tables" / "table6_per_seed.csv").unlink()
    text_md = report.write_answer(out).read_text()
    rows = [ln for ln in text_md.splitlines() if ln.startswith("| ") and not ln.startswith("| point")]
    assert [r.split("|")[1].split(":")[0].strip() for r in rows] == ["headline", "paper", "map",
                                                                   "joint law at the paper's N and D"]
    assert "not computed (no tables/token_budget_law_paper.csv)" in rows[3]
    assert "(no tables/table6_per_seed.csv: losses and p not computed)" in rows[0]
    assert "The joint law's answer is missing: no tables/token_budget_law_paper.csv" in text_md


@pytest.mark.parametrize("name, damage, lacking", [
    ("token_budget_gaps", lambda t: t.rename(columns={"active_mean": "mean_active"}), "['active_mean']"),
    ("token_budget_law_paper", lambda t: t.drop(columns=["identified"]), "['identified']"),
    ("headline_gaps", lambda t: t.drop(columns=["ci_low"]), "['ci_low']"),
    ("token_budget_per_seed", lambda t: t.drop(columns=["dense"]), "['dense']"),
])
def test_a_table_with_a_wrong_header_is_one_line_naming_it(out, name, damage, lacking):
    """A KeyError 'active_mean' traceback (exit 1) before."""
    from studylib.config import ConfigError

    _full(out)
    path = out / "tables" / f"{name}.csv"
    damage(pd.read_csv(path, index_col=0 if name == "headline_gaps" else None)).to_csv(
        path, index=name == "headline_gaps")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: lacks the column\(s\) {re.escape(lacking)}"):
        report.write_answer(out)


def test_a_table_that_is_not_csv_is_one_line_naming_it(out):
    from studylib.config import ConfigError

    _full(out)
    path = out / "tables" / "token_budget_gaps.csv"
    path.write_bytes(b"\x89PNG\x00\xff\xfe binary")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: "):
        report.write_answer(out)


def test_the_glance_refuses_a_long_first_screen():
    from studylib.study.comparisons import glance

    assert glance.words("At 3.53 tokens/param the MoE is +0.0026 [-0.0164, +0.0215] ahead.") == 10
    with pytest.raises(ValueError, match="9 sentences of .* at most 8 of 145 words"):
        glance.check_lead(["One."] * 9)
    with pytest.raises(ValueError, match="6 sentences of 150 words"):
        glance.check_lead([" ".join(["word"] * 25)] * 6)
    with pytest.raises(ValueError, match="a sentence of 31 words, at most 30 each"):
        glance.check_lead([" ".join(["word"] * 31)])


_PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                     "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")
