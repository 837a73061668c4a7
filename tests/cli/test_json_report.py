"""`--format json` prints one document, valid against the schema published in docs/cli.md."""

import json

import jsonschema

from .conftest import NO_APEX, SHIM_INPUT, run_cli, write


def test_json_document_matches_the_documented_schema(project, schema):
    write(project / "a.py", SHIM_INPUT)
    write(project / "b.py", NO_APEX)
    write(project / "c.py", "from apex import amp\ndef f(:\n")
    result = run_cli(["--format", "json", "--diff", "."], project)
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema)
    assert result.exit_code == document["exit_code"] == 2
    assert document["mode"] == "diff"
    assert [f["path"] for f in document["files"]] == ["a.py", "c.py"]  # b.py never mentions Apex
    a, c = document["files"]
    assert a["changed"] and not a["written"] and a["target_used"] == "shim"
    assert a["diff"].startswith("--- a.py\n+++ a.py\n")
    assert {d["severity"] for d in a["diagnostics"]} == {"warning"}
    assert c["diagnostics"][0]["code"] == "AMP001" and c["diagnostics"][0]["line"] == 2
    assert document["summary"]["files"] == 3 and document["summary"]["errors"] == 1


def test_json_without_diff_has_no_diff_and_fix_mode_reports_writes(project, schema):
    write(project / "a.py", SHIM_INPUT)
    result = run_cli(["--format", "json", "--target", "shim", "a.py"], project)
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema)
    (entry,) = document["files"]
    assert "diff" not in entry and entry["written"] and document["mode"] == "fix"
    assert document["summary"]["written"] == 1 and result.exit_code == 0


def test_check_json_exit_code(project, schema):
    write(project / "a.py", SHIM_INPUT)
    result = run_cli(["--format", "json", "--check", "--target", "shim", "a.py"], project)
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema)
    assert result.exit_code == document["exit_code"] == 1
