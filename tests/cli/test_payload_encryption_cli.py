"""The CLI with payload encryption (issue 16 item 4): ``treadle run`` seals what it
stores; ``runs get`` and ``inspect`` open values with the key and show
``<encrypted>`` without it; a bad key is one clear error at start; ``treadle
payload-key`` prints a key that works."""

from __future__ import annotations

import json

from tests.cli.conftest import Cli, one_error_line


def _key(cli: Cli) -> str:
    made = cli("payload-key", "--kid", "ops1")
    assert made.returncode == 0, made.stderr
    entry = made.stdout.strip()
    assert entry.startswith("ops1:")
    return entry


def test_values_are_readable_with_the_key_and_shown_encrypted_without_it(cli: Cli) -> None:
    key = _key(cli)
    done = cli(
        "run", "flows.py:hi", "--input", '{"name": "Zanzibar"}', env={"TREADLE_PAYLOAD_KEY": key}
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == '"hi Zanzibar"'
    run_id = cli.json("runs", "list")[0]["run_id"]

    world = (cli.cwd / "w").rglob("*")
    stored = "".join(p.read_bytes().decode("latin-1") for p in world if p.is_file())
    assert "Zanzibar" not in stored, "the input or output is stored in plaintext"

    keyed = cli("runs", "get", run_id, "--json", env={"TREADLE_PAYLOAD_KEY": key})
    assert keyed.returncode == 0, keyed.stderr
    shown = json.loads(keyed.stdout)
    assert shown["output"] == "hi Zanzibar"
    assert shown["input"] == {"args": [], "kwargs": {"name": "Zanzibar"}}

    keyless = cli.json("runs", "get", run_id)
    assert keyless["output"] == "<encrypted>"
    assert keyless["input"] == {"args": [], "kwargs": {"name": "<encrypted>"}}
    timeline = cli("inspect", run_id)
    assert timeline.returncode == 0, timeline.stderr
    assert "Zanzibar" not in timeline.stdout and "Traceback" not in timeline.stderr


def test_a_bad_payload_key_is_one_clear_error_naming_the_setting(cli: Cli) -> None:
    result = cli(
        "run", "flows.py:hi", "--input", '{"name": "x"}', env={"TREADLE_PAYLOAD_KEY": "k1:short"}
    )
    line = one_error_line(result)
    assert "TREADLE_PAYLOAD_KEY" in line and "k1" in line
    assert cli.json("runs", "list") == [], "nothing was recorded"
