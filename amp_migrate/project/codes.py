"""Diagnostics of the whole-tree pass (AMP030-AMP049): files that share Apex state, and Apex
reached where a per-file rewrite cannot see it."""
from __future__ import annotations

from ..diagnostics import Severity, define

GROUP_USES_SHIM = define(
    "AMP030", "group-uses-shim", Severity.WARNING,
    "This file shares Apex state with another file of the tree that uses the shim, so it uses "
    "the shim too.",
    "Apex's `amp` is one state per process: `amp.initialize` in one module sets up what "
    "`amp.scale_loss`, `amp.master_params` and `amp.state_dict` read in another, and an "
    "`FP16_Optimizer` built in one module is stepped in another. A native file beside a shim "
    "file that shares that state would train with two scalers, or call `amp_shim.amp` before "
    "anything initialized it. So files that share Apex objects (found by the project index: "
    "who calls `initialize`, who scales, steps or saves through it, and which modules import "
    "which) migrate together: all native, or all on the shim. The message names the file and "
    "line that keeps the group on the shim; migrate that one natively and the group follows.",
    before="# train.py\nmodel, optimizer = amp.initialize(model, optimizer)\ntrainer.fit(model, optimizer)\n"
           "# trainer.py\nwith amp.scale_loss(loss, optimizer) as scaled:\n    scaled.backward()",
    after="# train.py\nmodel, optimizer = amp.initialize(model, optimizer)  # from amp_shim import amp\n"
          "# trainer.py\nwith amp.scale_loss(loss, optimizer) as scaled:  # from amp_shim import amp\n"
          "    scaled.backward()",
    falls_back=True,
    refusal="it shares Apex state with a file that uses the shim",
)
MODULE_FROM_CALL = define(
    "AMP031", "apex-module-from-call", Severity.WARNING,
    "Apex's module reaches this file as a function's return value (`amp = get_amp(fp16)`); the "
    "file is left as it is, and the module that imports Apex uses the shim.",
    "The rules rewrite what an Apex import binds; a name bound to what another module's "
    "function returns is invisible to them. The provider (the function that imports and "
    "returns Apex's module) and every caller form one group, which uses the shim: the "
    "provider then returns `amp_shim.amp`, so the calls here keep working unchanged. "
    "`--check` counts the file. To migrate natively, import what the file needs directly.",
    before="# utils.py\ndef get_amp(fp16):\n    from apex import amp\n    return amp\n"
           "# train.py\namp = get_amp(args.fp16)\nmodel, optimizer = amp.initialize(model, optimizer)",
    after="# utils.py\ndef get_amp(fp16):\n    from amp_shim import amp\n    return amp\n"
          "# train.py (unchanged)\namp = get_amp(args.fp16)\nmodel, optimizer = amp.initialize(model, optimizer)",
    refusal="Apex's module arrives as a function's return value",
)
IMPORTED_DYNAMICALLY = define(
    "AMP032", "apex-imported-dynamically", Severity.WARNING,
    "Apex is imported at run time (`importlib.import_module(\"apex.amp\")`, `__import__`); the "
    "import is left as it is, and the files sharing its state use the shim.",
    "An import spelled as a string is not an import statement: the rules cannot bind what it "
    "returns, and rewriting the string would only move the problem. The file keeps needing "
    "Apex, or the shim under its name (`amp-migrate run -- python train.py` and "
    "`python -m amp_shim train.py` make `apex` import the shim). `--check` counts the file. "
    "Replace the dynamic import by an import statement to migrate the file.",
    before="amp = importlib.import_module(\"apex.amp\")",
    after="amp = importlib.import_module(\"apex.amp\")  # unchanged; run with `amp-migrate run`",
    refusal="Apex is imported at run time by name",
)
OBJECT_FROM_ANOTHER_FILE = define(
    "AMP033", "apex-object-from-another-file", Severity.WARNING,
    "This file uses an Apex object that another file of the tree makes "
    "(`optimizer.backward(loss)` on the FP16_Optimizer it was handed, `amp.state_dict()` on an "
    "`amp` passed in); it is left as it is and the files sharing the object use the shim.",
    "The file imports no Apex, so a per-file migration leaves it untouched; had the file that "
    "builds the object gone native, these calls would fail at run time (a torch optimizer has "
    "no `backward`). The group uses the shim, whose objects have every method Apex's had.",
    before="# trainer.py (no Apex import)\ndef step(optimizer, loss):\n    optimizer.backward(loss)\n"
           "    optimizer.step()",
    after="# trainer.py: unchanged; train.py, which builds the FP16_Optimizer, uses the shim",
    refusal="it uses an Apex object another file makes",
)
GROUP_NOT_NATIVE = define(
    "AMP034", "group-not-native", Severity.ERROR,
    "`--target native`: another file that shares Apex state with this one cannot go native, so "
    "this one is left untouched too.",
    "Files that share Apex objects must migrate together (see AMP030); under `--target native` "
    "there is no shim to fall back to, so a group migrates natively as a whole or not at all. "
    "The message names the file that blocks the group.",
    refusal="a file sharing its Apex state cannot go native",
)
