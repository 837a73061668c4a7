"""Files Python reads and the codemod once mangled or refused: CR-only (old Mac) line breaks,
which lost the final newline on a rewrite, and indentation that mixes tabs and spaces the
way Python accepts and libcst's parser does not."""

import pytest

from .conftest import NATIVE_INPUT, SHIM_INPUT, SHIM_OUTPUT, run_cli, snapshot, write


def cr(text: str) -> bytes:
    return text.replace("\n", "\r").encode()


def migrate(project, *args):
    result = run_cli([*args, "."], project)
    assert result.exit_code == 0, result.output
    return result


def test_cr_files_keep_their_final_newline_or_its_absence(project):
    write(project / "a.py", cr(SHIM_INPUT))
    write(project / "b.py", cr(SHIM_INPUT.rstrip("\n")))
    kept = {
        "kept.py": cr("# apex was here\nimport torch\nx = torch.ones(1)\n"),
        "mixed.py": b"# apex was here\rimport torch\r\nx = 1\ny = 2\r",
    }
    for name, data in kept.items():
        write(project / name, data)
    migrate(project, "--target", "shim")
    assert (project / "a.py").read_bytes() == cr(SHIM_OUTPUT)
    assert (project / "b.py").read_bytes() == cr(SHIM_OUTPUT.rstrip("\n"))
    for name, data in kept.items():
        assert (project / name).read_bytes() == data


def native_output(tmp_path) -> str:
    """What the native rewrite makes of NATIVE_INPUT with `\\n` breaks."""
    write(tmp_path / "lf" / "train.py", NATIVE_INPUT)
    migrate(tmp_path / "lf", "--target", "native")
    out = (tmp_path / "lf" / "train.py").read_text()
    assert "from apex" in NATIVE_INPUT and "from apex" not in out and "GradScaler" in out
    return out


def test_a_native_rewrite_of_a_cr_file_has_only_cr_breaks_and_ends_with_one(project, tmp_path):
    write(project / "train.py", cr(NATIVE_INPUT))
    migrate(project, "--target", "native")
    assert (project / "train.py").read_bytes() == cr(native_output(tmp_path))


def test_mixed_breaks_survive_a_rewrite_that_adds_and_removes_lines(project, tmp_path):
    write(project / "train.py", NATIVE_INPUT.replace("\n", "\r", 3))  # CR on the first three lines
    migrate(project, "--target", "native")
    # `import torch` and the blank line keep their CR; the Apex import is gone; new lines
    # get the file's most common break, and the last line keeps its LF.
    expected = native_output(tmp_path).replace("\n", "\r", 2)
    assert expected.startswith("import torch\r\rdef train(")
    assert (project / "train.py").read_bytes() == expected.encode()


def test_a_bom_cr_file_keeps_bom_and_breaks(project):
    write(project / "a.py", b"\xef\xbb\xbf" + cr(SHIM_INPUT))
    migrate(project, "--target", "shim")
    assert (project / "a.py").read_bytes() == b"\xef\xbb\xbf" + cr(SHIM_OUTPUT)


def test_mixed_breaks_with_a_final_bare_cr_survive_a_rewrite(project):
    before = b"x = 1\r\nfrom apex import amp\ry = 2\nmodel, optimizer = amp.initialize(model, optimizer)\r"
    write(project / "a.py", before)
    migrate(project, "--target", "shim")
    assert (project / "a.py").read_bytes() == before.replace(b"from apex", b"from amp_shim")


def test_diff_of_a_cr_file_is_readable_and_keeps_the_file(project):
    write(project / "a.py", cr(SHIM_INPUT))
    before = snapshot(project)
    result = migrate(project, "--diff", "--target", "shim")
    assert "-from apex import amp\n+from amp_shim import amp\n" in result.output
    assert "No newline at end of file" not in result.output
    assert "\r" not in result.output
    assert snapshot(project) == before


def test_diff_of_a_cr_file_without_final_newline_says_so(project):
    write(project / "a.py", cr(SHIM_INPUT.rstrip("\n")))
    result = migrate(project, "--diff", "--target", "shim")
    assert (
        "-from apex import amp\n+from amp_shim import amp\n"
        " model, optimizer = amp.initialize(model, optimizer)\n\\ No newline at end of file\n"
    ) in result.output


# Python accepts these: `\t    ` is column 12 (and 5 counting a tab as one), deeper than the
# four spaces around it; libcst needs a deeper block to start with its enclosing block's text.
TAB_MIXED = (
    "import torch\n"
    "from apex import amp\n"
    "\n"
    "def train(model, optimizer, x):\n"
    '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
    "    for step in range(3):\n"
    "\t    loss = model(x).sum()\n"
    "\t    with amp.scale_loss(loss, optimizer) as scaled:\n"
    "\t    \tscaled.backward()\n"
    "\t    optimizer.step()\n"
    "    return model\n"
)


def spaced(text: str) -> str:
    """`text` with every line's leading tabs expanded, as Python counts them."""
    return "".join(
        line[: len(line) - len(line.lstrip())].expandtabs(8) + line.lstrip()
        for line in text.splitlines(keepends=True)
    )


def test_tab_mixed_indentation_python_accepts_is_migrated_to_the_shim_as_it_was(project):
    compile(TAB_MIXED, "train.py", "exec")
    write(project / "train.py", TAB_MIXED)
    migrate(project, "--target", "shim")
    assert (project / "train.py").read_text() == TAB_MIXED.replace("from apex", "from amp_shim")


def test_tab_mixed_indentation_is_migrated_natively_keeping_its_spelling(project, tmp_path):
    write(project / "train.py", TAB_MIXED)
    write(tmp_path / "spaces" / "train.py", spaced(TAB_MIXED))
    migrate(project, "--target", "native")
    migrate(tmp_path / "spaces", "--target", "native")
    out = (project / "train.py").read_text()
    compile(out, "train.py", "exec")
    # The same program as the migration of the file reindented with spaces ...
    assert spaced(out) == (tmp_path / "spaces" / "train.py").read_text()
    # ... indented the file's way: kept lines as they were, new ones like the lines they replace.
    assert "\n    for step in range(3):\n\t    with torch.autocast(" in out
    assert "\n\t    \tloss = model(x).sum()\n\t    scaler.scale(loss).backward()\n" in out
    assert "\n    return model\n" in out


def test_same_depth_spelled_two_ways_keeps_both_spellings(project):
    # ` \t\t` and `\t \t` are both column 16 (3 counting tabs as one): one block to Python;
    # libcst renders the second like the first.
    source = (
        "from apex import amp\nif amp:\n \t\tx = 1\n\t \ty = 2\n"
        "model, optimizer = amp.initialize(model, optimizer)\n"
    )
    compile(source, "a.py", "exec")
    write(project / "a.py", source)
    migrate(project, "--target", "shim")
    assert (project / "a.py").read_text() == source.replace("from apex", "from amp_shim")


def test_indentation_that_cannot_be_kept_is_reported_at_its_line_not_as_a_syntax_error(project, monkeypatch):
    from amp_migrate.io.indentation import TabIndents

    monkeypatch.setattr(TabIndents, "restore", lambda self, code: None)  # a restore that fails its check
    write(project / "train.py", TAB_MIXED)
    before = snapshot(project)
    result = run_cli(["--target", "shim", "train.py"], project)
    assert result.exit_code == 2, result.output
    assert (
        "train.py:7:1: AMP004 the parser cannot read the tab-mixed indentation at line 7; Python accepts it"
    ) in result.output
    assert "expand -i -t 8" in result.output
    assert "syntax error" not in result.output
    assert snapshot(project) == before


def _tab_mixed_programs(count: int, seed: int = 18):
    """Training loops indented with random spellings Python accepts (each block deeper in
    columns both ways) that libcst cannot read or would render otherwise."""
    import itertools
    import random

    import libcst as cst

    rng = random.Random(seed)
    pool = sorted(
        {"".join(p) for n in range(1, 5) for p in itertools.product(" \t", repeat=n)}
        | {" " * k for k in range(5, 13)}
        | {"\t" + " " * k for k in range(1, 9)}
    )
    pair = {w: (len(w.expandtabs(8)), len(w)) for w in pool}  # columns, counting a tab as 8 and as 1
    body = [
        "x = 1",
        "y = amp",
        "loss = model(x).sum()",
        "z = (1,\n\t  2)",
        "s = '''a\n\t b'''",
        "with amp.scale_loss(loss, optimizer) as scaled:",
        "if step:",
        "# note",
        "",
    ]
    found = []
    while len(found) < count:
        lines = [
            "import torch",
            "from apex import amp",
            "def train(model, optimizer, x, step):",
            "    model, optimizer = amp.initialize(model, optimizer)",
        ]
        stack, opens = ["    "], False
        for _ in range(rng.randint(3, 12)):
            if opens:
                col, alt = len(stack[-1].expandtabs(8)), len(stack[-1])
                deeper = [w for w in pool if col < pair[w][0] < col + 10 and pair[w][1] > alt]
                stack.append(rng.choice(deeper) if deeper else stack[-1] + "\t")
            elif len(stack) > 1 and rng.random() < 0.25:
                stack.pop()
            same = [w for w in pool if pair[w] == pair.get(stack[-1])] or [stack[-1]]
            indent = rng.choice(same) if rng.random() < 0.3 else stack[-1]
            statement = rng.choice(body)
            lines.append((rng.choice(pool) if statement in ("", "# note") else indent) + statement)
            opens = statement.endswith(":")
        if opens:
            lines.append(stack[-1] + " pass")
        text = "\n".join(lines + ["    return model", ""])
        try:
            compile(text, "train.py", "exec")
        except SyntaxError:
            continue
        try:
            readable = cst.parse_module(text).code == text
        except cst.ParserSyntaxError:
            readable = False
        if not readable:
            found.append(text)
    return found


@pytest.mark.slow
def test_tab_mixed_programs_python_accepts_migrate_keeping_their_indentation():
    import ast

    from amp_migrate import migrate_source
    from amp_migrate.io.indentation import tab_indents

    for text in _tab_mixed_programs(20):
        shim = migrate_source(text, target="shim")
        assert shim.code == text.replace("from apex", "from amp_shim"), text
        # The twin indents every statement with spaces; continuation lines, blank lines and
        # comments keep their tabs.
        twin = tab_indents(text).text
        assert all(
            "\t" not in line[: len(line) - len(line.lstrip())]
            for line in twin.split("\n")
            if line.strip() not in ("", "# note", "2)", "b'''")
        ), twin
        assert ast.dump(ast.parse(twin)) == ast.dump(ast.parse(text))
        auto, expected = migrate_source(text), migrate_source(twin)
        assert auto.changed and auto.target_used == expected.target_used, text
        assert ast.dump(ast.parse(auto.code)) == ast.dump(ast.parse(expected.code)), text


def test_diagnostics_on_tab_indented_lines_point_at_the_files_columns(project):
    source = TAB_MIXED.replace(
        "\t    optimizer.step()\n", "\t    print(amp._amp_state.loss_scalers[0])\n\t    optimizer.step()\n"
    )
    compile(source, "train.py", "exec")
    write(project / "train.py", source)
    result = run_cli(["--check", "--target", "auto", "train.py"], project)
    # `\t    print(` is 11 characters: `amp` starts at column 12 of line 10 (the spaced twin's 19).
    assert "train.py:10:12: AMP311" in result.output, result.output
