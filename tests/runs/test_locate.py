"""Locating a diverging step's statements from the call sites both runs recorded, on call lists
and sources written by hand (no training runs)."""

from __future__ import annotations

from amp_migrate.runs.locate import Source, changed_sources, describe, locate

ORIGINAL = """\
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for x in data:
    loss = model(x).sum()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    amp.load_state_dict(checkpoint["amp"])
    optimizer.step()
"""

#: ORIGINAL migrated, with the migrated load_state_dict deleted and autocast left out.
MIGRATED = """\
scaler = torch.amp.GradScaler("cpu")
for x in data:
    loss = model(x).sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""

SHIM_STEP = [
    ["forward (autocast cpu float16)", "train.py", 3],
    ["amp.scale_loss", "train.py", 4],
    ["amp.load_state_dict", "train.py", 6],
    ["optimizer.step", "train.py", 7],
]
NATIVE_STEP = [
    ["forward (no autocast)", "train.py", 3],
    ["scaler.scale", "train.py", 4],
    ["forward (no autocast)", "train.py", 3],
    ["scaler.scale", "train.py", 4],
    ["scaler.step", "train.py", 5],
    ["scaler.update", "train.py", 6],
]


def source() -> Source:
    return Source.of(ORIGINAL, MIGRATED)


def test_changed_lines_are_the_lines_the_migration_wrote_not_those_it_kept():
    assert source().changed_lines() == {1, 4, 5, 6}


def test_an_original_line_maps_to_its_kept_line_its_rewritten_line_or_an_empty_deletion():
    assert source().migrated_range(3) == (3, 3)  # kept as it was
    assert source().migrated_range(1) == (1, 1)  # initialize rewritten in place
    # load_state_dict: no line of its changed block reads like it, so the whole block.
    assert source().migrated_range(6) == (4, 6)
    deleted = Source.of("a\nb\nc\n", "a\nc\n")
    assert deleted.migrated_range(2) == (2, 1)


def test_the_step_lists_the_migrated_calls_once_each_with_how_often_they_ran():
    location = locate(1, [SHIM_STEP], [NATIVE_STEP], {"train.py": source()}, lambda path: None)
    ran = {(site.call, site.line): site for site in location.ran}
    assert list(ran) == [
        ("forward (no autocast)", 3),
        ("scaler.scale", 4),
        ("scaler.step", 5),
        ("scaler.update", 6),
    ]
    assert ran[("scaler.scale", 4)].times == 2 and ran[("scaler.step", 5)].times == 1
    assert ran[("scaler.update", 6)].text == "scaler.update()" and ran[("scaler.update", 6)].changed
    forward = ran[("forward (no autocast)", 3)]
    assert not forward.changed
    assert forward.note == "the original's forward here ran with autocast cpu float16"


def test_an_original_amp_call_with_no_migrated_counterpart_at_the_step_is_missing():
    location = locate(1, [SHIM_STEP], [NATIVE_STEP], {"train.py": source()}, lambda path: None)
    [missing] = location.missing  # scale_loss and the step have their counterparts
    assert (missing.call, missing.original_line, missing.expected) == (
        "amp.load_state_dict",
        6,
        ("scaler.load_state_dict",),
    )
    assert missing.original_text == 'amp.load_state_dict(checkpoint["amp"])'
    text = "\n".join(describe(location))
    assert "train.py:6* scaler.update: scaler.update()" in text
    assert "train.py:4* scaler.scale (2 times)" in text
    assert "the original's amp calls at step 1 that the migrated program did not make:" in text
    assert (
        '  train.py:6 amp.load_state_dict: amp.load_state_dict(checkpoint["amp"])  '
        "-> no scaler.load_state_dict ran; migrated: lines 4-6: "
        "scaler.scale(loss).backward() | scaler.step(optimizer) | scaler.update()"
    ) in text


def test_a_scaler_step_without_its_update_misses_the_update_of_the_originals_step():
    native = [call for call in NATIVE_STEP if call[0] != "scaler.update"]
    location = locate(1, [SHIM_STEP], [native], {"train.py": source()}, print)
    assert [(m.call, m.expected, m.original_line) for m in location.missing] == [
        ("amp.load_state_dict", ("scaler.load_state_dict",), 6),
        ("optimizer.step", ("scaler.update",), 7),
    ]
    # In the changed block, the line of the scaler.step that ran without its update.
    assert location.missing[1].migrated_lines == (5, 5)
    assert location.missing[1].migrated_text == ("scaler.step(optimizer)",)


def test_a_copy_kept_on_the_shim_makes_the_originals_calls_and_misses_none():
    shim_copy = [[call, "train.py", line] for call, _, line in SHIM_STEP]
    location = locate(1, [SHIM_STEP], [shim_copy], {}, lambda path: ORIGINAL)
    assert location.missing == ()


def test_unmigrated_files_are_read_for_their_lines_and_steps_out_of_range_locate_nothing():
    calls = [[["forward (no autocast)", "model.py", 2]]]
    location = locate(1, [[]], calls, {}, lambda path: "class Net:\n    out = self.fc(x)\n")
    [site] = location.ran
    assert (site.text, site.changed, site.note) == ("out = self.fc(x)", False, "")
    assert locate(5, [], calls, {}, lambda path: None).ran == ()
    assert describe(locate(5, [], calls, {}, lambda path: None)) == []


def test_a_scaler_call_under_a_guard_the_migration_wrote_names_the_guard():
    migrated = MIGRATED.replace(
        "    scaler.step(optimizer)\n    scaler.update()\n",
        "    if torch.isfinite(loss):\n        scaler.step(optimizer)\n        scaler.update()\n",
    )
    guarded = Source.of(ORIGINAL, migrated)
    location = locate(1, [SHIM_STEP], [[["scaler.update", "train.py", 7]]], {"train.py": guarded}, print)
    assert location.ran[0].note == "under `if torch.isfinite(loss):` (line 5), which the migration wrote"
    # The user's own loop around it is no guard the migration wrote.
    kept = locate(1, [SHIM_STEP], [[["scaler.scale", "train.py", 4]]], {"train.py": source()}, print)
    assert kept.ran[0].note == ""


def test_changed_sources_keeps_only_files_whose_text_changed():
    sources = changed_sources({"a.py": "x\n", "b.py": "y\n"}, {"a.py": "x\n", "b.py": "z\n"})
    assert list(sources) == ["b.py"]
