"""``treadle start --attr`` and ``treadle runs list --attr`` (issue 17 item 2): seeding,
searching (repeatable, ANDed, typed values), and one-line errors for bad pairs."""

from __future__ import annotations

from tests.cli.conftest import Cli, one_error_line


def test_start_seeds_attributes_and_runs_list_filters_by_them(cli: Cli) -> None:
    gold = cli.json("start", "flows.py:hi", "--input", '["a"]', "--attr", "tier=gold",
                    "--attr", "n=3")["run_id"]  # fmt: skip
    text = cli.json("start", "flows.py:hi", "--input", '["b"]', "--attr", "tier=gold",
                    "--attr", 'n="3"')["run_id"]  # fmt: skip
    cli.json("start", "flows.py:hi", "--input", '["c"]', "--attr", "tier=silver")
    assert cli.json("runs", "get", gold)["attributes"] == {"tier": "gold", "n": 3}
    listed = cli.json("runs", "list", "--attr", "tier=gold")
    assert {r["run_id"] for r in listed} == {gold, text}
    assert [
        r["run_id"] for r in cli.json("runs", "list", "--attr", "tier=gold", "--attr", "n=3")
    ] == [gold]
    assert [r["run_id"] for r in cli.json("runs", "list", "--attr", 'n="3"')] == [text]
    assert cli.json("runs", "list", "--attr", "tier=bronze") == []
    shown = cli("runs", "get", gold)
    assert "attributes:" in shown.stdout and '"tier"' in shown.stdout, shown.stdout


def test_bad_attr_pairs_are_one_line_usage_errors(cli: Cli) -> None:
    for argv, named in (
        (["runs", "list", "--attr", "tier"], "expected KEY=VALUE"),
        (["runs", "list", "--attr", "bad key=1"], "'bad key'"),
        (["runs", "list", "--attr", "tier=" + "x" * 2000], "over 1024 bytes"),
        (["start", "flows.py:hi", "--input", '["a"]', "--attr", "9lives=1"], "'9lives'"),
    ):
        result = cli(*argv)
        assert result.returncode == 2, result.stderr
        assert named in one_error_line(result)
    assert cli.json("runs", "list") == [], "the refused start recorded nothing"
