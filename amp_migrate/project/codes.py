"""Diagnostics of the whole-tree pass (AMP030-AMP049): files that share Apex state, and Apex
reached where a per-file rewrite cannot see it."""

from __future__ import annotations

from ..diagnostics import Severity, define

# Handing the scaler over where the index alone would refuse: AMP153-AMP154.
INFERENCE_OWNER_APART = define(
    "AMP153",
    "inference-initialize-apart",
    Severity.INFO,
    "This program's `initialize` only prepares models for inference (no optimizer), in a process "
    "of its own that runs none of the code that scales: it does not compete for the GradScaler "
    "another module builds for the module it imports a helper from.",
    "A trainer module is tied to every module that calls `initialize` and may share a process "
    "with it, and two such modules give it no single scaler. An evaluation script that imports "
    "`to_cuda` from the trainer module and calls `amp.initialize(model, opt_level=...)` with no "
    "optimizer set up nothing the trainer's `scale_loss` could use: Apex scales only for an "
    "optimizer some `initialize` was given. It steps aside where it runs only as a program "
    '(`if __name__ == "__main__":`, imported by no module of the tree), imports no module that '
    "trains, and names no function of the trainer module that uses Apex; it keeps its own "
    "migration (its block under `torch.autocast`, AMP150/AMP151) and the trainer module gets "
    "the training module's scaler.",
    before='# score.py (a program)\nfrom engine import move_batch\nmodel = amp.initialize(model, opt_level="O1")',
    after='# score.py\nwith torch.autocast("cuda", dtype=torch.float16, enabled=True):\n    ...',
)
SWITCH_ARGUMENT_DOUBTED = define(
    "AMP154",
    "switch-argument-not-followed",
    Severity.WARNING,
    "A function of this module is given, by the module that builds the GradScaler, the test "
    "around that module's `initialize` as an argument (`train(..., fp16=cfg.fp16)`), but the "
    "argument cannot be relied on to be the scaler's switch here; its `if fp16:` branch keeps "
    "the shim (AMP220).",
    "`if fp16: <scaled backward> else: loss.backward()` collapses to one scaled backward only "
    "where `fp16` false means the scaler is disabled. The owner builds the scaler with "
    "`enabled=` its guard, so a parameter that every call passes that guard (an and-ed part of "
    "it, read unchanged) holds the switch. That needs every call to be the owner's, after the "
    "guard in the function that builds the scaler: another module that may call the function "
    "(in the full-precision path, `fp16=False`, with no scaler set up), a call before the "
    "guard, a reference to the function, a store into the guard's path or a rebinding of the "
    "parameter defeat it. The message names which.",
    before="# train.py\nif cfg.fp16:\n    model, opt = amp.initialize(model, opt)\n"
    "train(model, opt, fp16=cfg.fp16)\n# finetune.py\ntrain(model, opt, fp16=False)",
    after="# both files use the shim",
    falls_back=True,
    refusal="the argument carrying the scaler's switch may be given another value",
    fallback_title="the scaler's switch handed to another module's function, where it may take another value",
    shape=(
        "A training entry calls `initialize` under `if config.fp16:` and then the loop of the module it "
        "imports, `train(model, optimizer, ..., fp16=config.fp16)`, whose `if fp16: <scale_loss> else: "
        "loss.backward()` is native when the argument provably carries the scaler's switch "
        "(project/entry_switch.py). AMP154 (beside the loop's AMP220) names what stands in the way: another "
        "module that reaches the loop also names the function (a finetuning entry calling it with "
        "`fp16=False` and no `initialize`), the entry also calls it before the `if` or outside the function "
        "that builds the scaler, passes the function around as a value, stores into the guard's path "
        "(`config.fp16 = False`) or rebinds it, or the loop's own module calls the function or rebinds the "
        "parameter."
    ),
    fallback_why=(
        "The plain backward branch may then run while the scaler is enabled (its gradients would be unscaled "
        "by `scaler.step` though never scaled), or the loop may run in a process where no scaler was ever "
        "set on its module (Apex's `fp16=False` path needed none)."
    ),
    by_hand=(
        "Give the other caller the scaler's own switch, or scale unconditionally in the loop "
        "(`scaler.scale(loss).backward()`, the scaler disabled where fp16 is off) and pass the scaler."
    ),
)
GROUP_USES_SHIM = define(
    "AMP030",
    "group-uses-shim",
    Severity.WARNING,
    "This file shares Apex state with another file of the tree that uses the shim, so it uses the shim too.",
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
    fallback_title="a member of a group that cannot go native as a whole",
    shape=(
        "A file that would go native alone, tied by shared Apex state (the scaler, a model or optimizer "
        "`initialize` returned) to a file that must use the shim."
    ),
    fallback_why=(
        "Apex's amp is one state per process: a native `train.py` beside a trainer module that still calls "
        "`amp.scale_loss` on the optimizer it was handed fails at run time. So the group ends on one target, "
        "and `AMP030` at each member's Apex site names the file and line that holds the group on the shim."
    ),
    by_hand=(
        "Fix the reason at the named place (`amp-migrate explain` with the code reported there says what to "
        "change); the group then goes native in one run."
    ),
)
MODULE_FROM_CALL = define(
    "AMP031",
    "apex-module-from-call",
    Severity.WARNING,
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
    "AMP032",
    "apex-imported-dynamically",
    Severity.WARNING,
    'Apex is imported at run time (`importlib.import_module("apex.amp")`, `__import__`); the '
    "import is left as it is, and the files sharing its state use the shim.",
    "An import spelled as a string is not an import statement: the rules cannot bind what it "
    "returns, and rewriting the string would only move the problem. The file keeps needing "
    "Apex, or the shim under its name (`amp-migrate run -- python train.py` and "
    "`python -m amp_shim train.py` make `apex` import the shim). `--check` counts the file. "
    "Replace the dynamic import by an import statement to migrate the file.",
    before='amp = importlib.import_module("apex.amp")',
    after='amp = importlib.import_module("apex.amp")  # unchanged; run with `amp-migrate run`',
    refusal="Apex is imported at run time by name",
)
OBJECT_FROM_ANOTHER_FILE = define(
    "AMP033",
    "apex-object-from-another-file",
    Severity.WARNING,
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
    "AMP034",
    "group-not-native",
    Severity.ERROR,
    "`--target native`: another file that shares Apex state with this one cannot go native, so "
    "this one is left untouched too.",
    "Files that share Apex objects must migrate together (see AMP030); under `--target native` "
    "there is no shim to fall back to, so a group migrates natively as a whole or not at all. "
    "The message names the file that blocks the group.",
    refusal="a file sharing its Apex state cannot go native",
)

# Apex's module from a provider function of the tree (project/provide.py): AMP161-AMP164.
PROVIDED_NOW_SCALER = define(
    "AMP161",
    "provided-module-now-scaler",
    Severity.INFO,
    "`amp = get_amp(fp16)` goes: the provider returned Apex's module exactly when its condition "
    "held (None otherwise), so the GradScaler built where `initialize` runs, enabled under that "
    "condition in this caller's arguments, takes the value's place.",
    "The provider only imports Apex's module and returns it (or None), so its call means, in "
    "the caller, `amp = None; if <cond>: from apex import amp`, with `<cond>` the provider's "
    "test spelled in the call's arguments. That is the shape the module-value rules migrate: "
    "the scaler is enabled where the value was Apex's module and disabled where it was None, "
    "and `if amp:` reads `scaler.is_enabled()`. The `try: from apex import amp except "
    "ImportError: raise ...` inside the provider only raised where Apex was missing, which "
    "native code does not need. The caller no longer imports the provider.",
    before="from utils import get_amp\namp = get_amp(fp16)\nif fp16 and amp:\n"
    '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")',
    after='scaler = torch.amp.GradScaler("cuda", enabled=bool(fp16))',
)
PROVIDER_NOT_FOLLOWED = define(
    "AMP162",
    "apex-provider-not-followed",
    Severity.WARNING,
    "The function that hands Apex's module to its callers does more than import it and return "
    "it (or None), or is reached where the tree does not show: its group uses the shim.",
    "A provider call can become the GradScaler only where the provider is nothing but `if "
    "<cond>: from apex import amp` (a `try` whose `except ImportError` only raises allowed), "
    "`amp = None` otherwise, and `return amp`, with `<cond>` a pure test of its parameters. "
    'Anything else it does (`amp.register_half_function(torch, "einsum")` registers a cast '
    "for the whole process, a print, a fallback to None when Apex is missing) has no place in "
    "a scaler, and a provider named where no call can be followed (another module, `__all__`, "
    "a reference) might hand Apex's module to code that calls it. The message names the "
    "provider's line that stands in the way.",
    before="def get_amp(fp16):\n    if fp16:\n        from apex import amp\n"
    '        amp.register_half_function(torch, "einsum")\n    else:\n        amp = None\n    return amp',
    after="# the provider returns amp_shim's module; its callers are left as they are",
    falls_back=True,
    refusal="the provider of Apex's module does more than import and return it",
    fallback_title="Apex's module from a provider function that cannot be followed",
    shape=(
        "A provider `def get_amp(fp16): if fp16: try: from apex import amp except ImportError: raise ... "
        "else: amp = None; return amp`, called as `amp = get_amp(fp16)`, that does more than import and "
        'return (`amp.register_half_function(torch, "einsum")`, a print, `except ImportError: amp = '
        "None`), whose condition is not a pure test of its parameters, whose module uses Apex beside it, or "
        "that some module names without a call the project follows (`__init__.py` re-exporting it, a "
        "docstring). Reported at the provider's line and at each call."
    ),
    fallback_why=(
        "Where both sides are proven the call is the GradScaler built where `initialize` runs and the "
        "provider is removed (AMP161, AMP164; docs/decisions.md, \"Apex's module from a provider "
        'function"). A cast the provider registers for the whole process, or a value that may reach code '
        "that calls Apex directly, has no GradScaler equivalent; the group keeps the shim (the provider "
        "returns `amp_shim.amp`, the callers are left as they are, AMP031)."
    ),
    by_hand=(
        'Build `scaler = torch.amp.GradScaler("cuda", enabled=fp16)` where `initialize` ran and pass it '
        "where the module went; for a registered cast, run that op under `torch.autocast` in half precision "
        "yourself."
    ),
)
PROVIDED_NOT_FOLLOWED = define(
    "AMP163",
    "provided-module-not-followed",
    Severity.WARNING,
    "This caller's `amp = get_amp(...)` cannot become the GradScaler: the value is stored, "
    "returned, passed on where the tree does not show, or `initialize` does not run under a "
    "test of it; the provider's group uses the shim.",
    "The value is Apex's module exactly when the provider's condition held; a scaler can take "
    "its place only where `initialize` runs under a test equal to that condition (`if amp:`, "
    "`if fp16 and amp:`), the arguments it was computed from are not rebound, and every use of "
    "the value is visible (the rules of AMP155). Stored on `self`, returned, or handed to code "
    "the tree does not show, it might reach code that calls Apex directly. The message names "
    "the place.",
    before="self.amp = get_amp(fp16)",
    after="self.amp = get_amp(fp16)  # unchanged; the provider returns amp_shim's module",
    falls_back=True,
    refusal="the value a provider returned cannot be followed",
    fallback_title="Apex's module from a provider function that cannot be followed",
    shape=(
        "A call `amp = get_amp(fp16)` of a provider that imports Apex's module under its condition and "
        "returns it, where the value is stored (`self.amp = get_amp(fp16)`), the call is not a statement of "
        "a module-level function, `initialize` does not run under a test equal to the provider's condition "
        "(`if amp:`, `if fp16 and amp:`, `if fp16:`), the arguments the condition reads are rebound, or the "
        "value then goes where AMP155 refuses (returned, read before `initialize`, handed to another "
        "module). Reported at the call."
    ),
    fallback_why=(
        "Where both sides are proven the call is the GradScaler built where `initialize` runs and the "
        "provider is removed (AMP161, AMP164; docs/decisions.md, \"Apex's module from a provider "
        'function"). A cast the provider registers for the whole process, or a value that may reach code '
        "that calls Apex directly, has no GradScaler equivalent; the group keeps the shim (the provider "
        "returns `amp_shim.amp`, the callers are left as they are, AMP031)."
    ),
    by_hand=(
        'Build `scaler = torch.amp.GradScaler("cuda", enabled=fp16)` where `initialize` ran and pass it '
        "where the module went; for a registered cast, run that op under `torch.autocast` in half precision "
        "yourself."
    ),
)
PROVIDER_REMOVED = define(
    "AMP164",
    "apex-provider-removed",
    Severity.INFO,
    "The function that returned Apex's module is removed: every call of it in the tree now "
    "builds the GradScaler where `initialize` runs.",
    "No call of the provider is left in the tree, and a provider kept as it was would still "
    "import Apex. Returning a GradScaler in its place would build it before `initialize`'s "
    "options (O0, a static loss scale) are known, and hand callers outside the tree a scaler "
    "where they expect Apex's module; removed, an importer outside the tree fails at import "
    "time, loudly, rather than training differently.",
    before="def get_amp(fp16):\n    if fp16:\n        from apex import amp\n    else:\n        amp = None\n    return amp",
    after="# removed",
)
