"""docs/performance.md's tables and the README's results are what the benchmark records say:
each table is made by benchmarks/perf_tables.py from the latest record in its folder."""
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import perf_tables  # noqa: E402
import results  # noqa: E402

PERFORMANCE = REPO / "docs" / "performance.md"
FOLDERS = sorted(p.name for p in (REPO / "benchmarks" / "results").iterdir() if p.is_dir())
RECORDS = sorted((REPO / "benchmarks" / "results").glob("*/*.json"))
FIX = "run `python benchmarks/perf_tables.py` and commit the page, or fix the record"


@pytest.mark.parametrize("page", perf_tables.PAGES, ids=lambda p: p.name)
def test_every_table_matches_the_latest_record_of_its_folder(page):
    stale = perf_tables.stale(page)
    assert not stale, f"{page.name}: the tables of {stale} differ from their latest records: {FIX}"


def test_every_table_of_the_performance_page_comes_from_a_record():
    text = PERFORMANCE.read_text()
    outside = perf_tables.BLOCK.sub("", text)
    rows = [line for line in outside.splitlines() if line.lstrip().startswith("|")]
    assert not rows, f"docs/performance.md has a table no record makes (put it in a results block): {rows[0]}"


def test_every_results_folder_has_its_table_and_every_table_its_folder():
    shown = [m["folder"] for m in perf_tables.BLOCK.finditer(PERFORMANCE.read_text())]
    assert len(shown) == len(set(shown)), f"a folder's table appears twice: {shown}"
    assert sorted(shown) == FOLDERS, (
        f"benchmarks/results folders without a table: {sorted(set(FOLDERS) - set(shown))} (put "
        f"'<!-- results: FOLDER -->' and '<!-- end results -->' where the table belongs in docs/performance.md, "
        f"then {FIX}); tables without a folder: {sorted(set(shown) - set(FOLDERS))}")


def test_the_page_keeps_a_gpu_workers_section():
    assert re.search(r"^## GPU workers$", PERFORMANCE.read_text(), re.M)


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_record_says_where_its_figures_come_from(path):
    rec = results.load(path)
    where = f"{path.parent.name}/{path.name}"
    for field in ("schema", "benchmark", "source", "date", "command", "machine", "result"):
        assert field in rec, f"{where} lacks {field!r}"
    assert rec["schema"] == results.SCHEMA, where
    results.when(rec)  # a date it can order
    assert rec["machine"].get("cpu") and rec["machine"].get("cores"), f"{where}: which machine?"
    assert rec["result"] and isinstance(rec["result"], dict), f"{where}: no figures"
    assert "SECRET" not in str(rec.get("environment", {})), f"{where} holds a secret's name or value"
    if rec["source"] == "run":
        assert re.fullmatch(r"[0-9a-f]{40}", rec["commit"] or ""), f"{where}: a run names its full commit"
        assert isinstance(rec["changed_files"], list), f"{where}: a run lists the files changed since its commit"
    else:
        assert rec["source"] == "transcribed", f"{where}: source is 'run' or 'transcribed'"
        assert rec.get("transcribed_from") or rec.get("note"), \
            f"{where}: a transcribed record says where its figures were copied from (transcribed_from or note)"
        assert rec.get("commit") or rec.get("recorded_in_commit"), f"{where}: which commit ran or recorded it?"
