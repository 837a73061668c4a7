"""The equivalence cases: each legacy program in fixtures/programs/equivalence/ with its arguments.

Tolerances (O3 and fp16_utils only; O2 is bit-identical) are the documented bounds of
docs/differences.md ("Equivalence harness" rows): about 3x the largest gap measured on CPU with
torch 2.13, so that they catch a change of behaviour, not a change of the last bits.
"""

from __future__ import annotations

from equivalence_harness import Case, Tolerance

O3_TOL = Tolerance(loss_rel=2e-2, param_rel=1e-1, converge=0.9)

CASES = [
    Case(
        "convnet-O0",
        "convnet_opt_levels.py",
        ("--opt-level", "O0"),
        covers="one model, one optimizer, O0 (runtime `opt_level=args.opt_level`)",
    ),
    Case("convnet-O1", "convnet_opt_levels.py", ("--opt-level", "O1"), covers="one model, one optimizer, O1"),
    Case(
        "convnet-O2",
        "convnet_opt_levels.py",
        ("--opt-level", "O2"),
        covers="one model, one optimizer, O2 (fp16 weights, fp32 masters, BatchNorm fp32)",
    ),
    Case(
        "convnet-O3",
        "convnet_opt_levels.py",
        ("--opt-level", "O3"),
        covers="one model, one optimizer, O3 (pure fp16, static loss scale 1.0: GradScaler disabled)",
        expect="tolerance",
        tolerance=O3_TOL,
    ),
    Case(
        "gan-num-losses",
        "gan_num_losses.py",
        ("--corrupt-step", "12"),
        covers="lists of models and optimizers, `num_losses=3`, `loss_id` (GAN); one overflow in loss 0",
        scales="per_loss",
    ),
    Case(
        "accumulation-delay-unscale",
        "accumulation_delay_unscale.py",
        covers="gradient accumulation with `delay_unscale`",
    ),
    Case(
        "hf-accumulation-clip",
        "hf_style_accumulation_clip.py",
        ("--fp16",),
        covers="accumulation without `delay_unscale`, `if args.fp16:` branches, clipping "
        "`amp.master_params`, LR schedule",
        unsafe="U1",
    ),
    Case(
        "clip-master-params-O1",
        "clip_master_params.py",
        ("--opt-level", "O1"),
        covers="clipping with `amp.master_params` at O1",
    ),
    Case(
        "clip-master-params-O2",
        "clip_master_params.py",
        ("--opt-level", "O2"),
        covers="clipping with `amp.master_params` at O2 (fp32 masters)",
    ),
    Case(
        "checkpoint-resume",
        "checkpoint_resume.py",
        covers="save with `amp.state_dict()`, resume with `amp.load_state_dict()` in a new process",
        phases=(
            ("--epochs", "2", "--checkpoint", "{dir}/ckpt.pt"),
            ("--epochs", "4", "--checkpoint", "{dir}/ckpt.pt", "--resume"),
        ),
    ),
    Case(
        "trainer-class",
        "trainer_class.py",
        covers="a Trainer class: `amp.initialize` in `__init__`, scaler on `self`",
    ),
    Case(
        "init-loop-split",
        "init_and_loop_split.py",
        covers="`import apex`; initialize and loop in different functions; static `loss_scale=128.0`",
    ),
    Case(
        "registered-casts",
        "registered_casts.py",
        covers="`register_half_function`, `register_float_function`, `disable_casts`",
    ),
    Case(
        "handle-api",
        "handle_api.py",
        covers="the old handle API: `amp.init()`, `wrap_optimizer`, `optimizer.scale_loss`",
    ),
    Case(
        "to-python-float",
        "imagenet_meters_to_python_float.py",
        covers="`apex.fp16_utils.to_python_float`, AverageMeter bookkeeping",
    ),
    Case(
        "fused-adam",
        "fused_optimizers.py",
        ("--optimizer", "fused_adam", "--corrupt-step", "7"),
        covers="`apex.optimizers.FusedAdam` with param groups; one overflow",
        min_skipped=1,
    ),
    Case(
        "fused-sgd",
        "fused_optimizers.py",
        ("--optimizer", "fused_sgd", "--corrupt-step", "7"),
        covers="`apex.optimizers.FusedSGD` (Nesterov); one overflow",
        min_skipped=1,
    ),
    Case(
        "fused-lamb",
        "lamb_and_novograd.py",
        ("--optimizer", "lamb", "--corrupt-step", "7"),
        covers="`apex.optimizers.FusedLAMB` with param groups and `max_grad_norm`: natively the "
        "class from `amp_shim.optimizers` under GradScaler (AMP505); one overflow",
        native_mode="migrated",
        min_skipped=1,
    ),
    Case(
        "fused-novograd",
        "lamb_and_novograd.py",
        ("--optimizer", "novograd", "--corrupt-step", "7"),
        covers="`apex.optimizers.FusedNovoGrad`: natively the class from `amp_shim.optimizers` "
        "under GradScaler (AMP505); one overflow",
        native_mode="migrated",
        min_skipped=1,
    ),
    Case(
        "overflow-storm",
        "overflow_storm.py",
        covers="repeated fp16 overflows: skipped steps and scale backoff",
        min_skipped=5,
    ),
    Case(
        "bf16-transformer",
        "bf16_transformer.py",
        covers="bfloat16: `AMP_SHIM_DTYPE=bfloat16` vs `--dtype bfloat16`",
        dtype="bfloat16",
        env=(("AMP_SHIM_DTYPE", "bfloat16"),),
        scales="native_disabled",
    ),
    Case(
        "wgan-n-critic-loss-ids",
        "wgan_n_critic_loss_ids.py",
        ("--corrupt-step", "7", "--corrupt-g-step", "12"),
        covers="critic steps every iteration, generator every `n_critic`-th, `num_losses=2` and "
        "`loss_id` 0/1: one GradScaler per loss id, each updated after its own step; "
        "overflows forced in both losses",
        min_skipped=2,
    ),
    Case(
        "wgan-gp-one-loss-id",
        "wgan_gp_one_loss_id.py",
        ("--corrupt-step", "7"),
        covers="one loss scaler, critic step then generator step each iteration (WGAN-GP): an "
        "`update()` after each step; critic overflow forced",
        min_skipped=1,
    ),
    Case(
        "accumulation-clip-every-micro-batch",
        "accumulation_clip_every_micro_batch.py",
        ("--corrupt-step", "7"),
        covers="clipping `amp.master_params` on every micro-batch of a `delay_unscale` window: "
        "Apex clipped the still-scaled partial sums (by default the shim; `--unsafe-fixes` "
        "clips once before the step, U2, which differs from the first window on)",
        native_xfail="AMP302",
    ),
    Case(
        "clip-every-micro-batch-no-delay",
        "clip_every_micro_batch_no_delay.py",
        ("--corrupt-step", "8", "--spike-step", "31"),
        covers="the pre-2020 Hugging Face loop: clipping `amp.master_params` after every "
        "micro-batch without `delay_unscale`, the step every 3rd (`--unsafe-fixes`: U1, and U2 "
        "moves the clipping before the step); an overflow on a window's last micro-batch; the "
        "partial sum of window 11 over the threshold, from where U2's difference shows",
        expect="documented",
        unsafe="U1 U2",
        min_skipped=1,
    ),
    Case(
        "clip-every-micro-batch-fp16-branch",
        "clip_every_micro_batch_fp16_branch.py",
        ("--fp16", "--corrupt-step", "8", "--spike-step", "31"),
        covers="the run_glue.py form: the clipping of `amp.master_params` in the `if args.fp16:` "
        "arm, the fp32 arm's own clipping, the scheduler stepped before the optimizer "
        "(`--unsafe-fixes`: U1, and U2 moves the clipping under `if args.fp16:` before the step)",
        expect="documented",
        unsafe="U1 U2",
        min_skipped=1,
    ),
    Case(
        "clip-every-micro-batch-fp16-branch-off",
        "clip_every_micro_batch_fp16_branch.py",
        ("--spike-step", "31"),
        covers="the same loop without `--fp16`: Apex never set up, the fp32 arm clips every "
        "micro-batch in both runs; the scaler disabled",
        unsafe="U1 U2",
        scales="native_disabled",
        apex_unused=True,
    ),
    Case(
        "clip-then-step-if-finite",
        "clip_then_step_if_finite.py",
        ("--corrupt-step", "7"),
        covers="`if torch.isfinite(grad_norm): optimizer.step()` after clipping (justified "
        "fallback: Apex's skip stays armed into the next step)",
        native_xfail="AMP301",
        min_skipped=1,
    ),
    Case(
        "amp-rebound-helper",
        "amp_rebound_helper.py",
        ("--corrupt-step", "9"),
        covers="`amp` rebound after training (`amp = AverageMeterPrinter()`, its own "
        "`state_dict()`): only the reads before the rebinding are Apex's; overflow forced",
        min_skipped=1,
    ),
    Case(
        "notebook-time-magic",
        "time_magic_notebook.ipynb",
        covers="a notebook: `%time state = amp.state_dict()` and `%timeit ... amp.state_dict()` "
        "migrated as code behind their magics, `!pip`/`%matplotlib` kept; overflow forced",
        min_skipped=1,
    ),
    Case(
        "log-loss-scale-and-checkpoint",
        "log_loss_scale_and_checkpoint.py",
        ("--corrupt-batch", "5"),
        covers="the scale logged from `amp._amp_state.loss_scalers[0].loss_scale()` and "
        '`amp.state_dict()["loss_scaler0"]["loss_scale"]` and saved as checkpoint '
        "metadata (`scaler.get_scale()`); one overflow per epoch",
        min_skipped=3,
    ),
    Case(
        "static-loss-scale-128",
        "static_loss_scale.py",
        covers="static `loss_scale=128.0` over 2,050 steps: the scale never grows (a default "
        "GradScaler doubles at step 2,000)",
    ),
    Case(
        "static-loss-scale-128-overflow",
        "static_loss_scale.py",
        ("--steps", "30", "--corrupt-step", "20"),
        covers="static `loss_scale=128.0` with a forced overflow: bit for bit until it, then the "
        "documented AMP111 difference (Apex applies the step, GradScaler skips and halves)",
        expect="static-overflow",
    ),
    Case(
        "static-loss-scale-one",
        "static_loss_scale_one.py",
        ("--corrupt-step", "25"),
        covers="`loss_scale=1.0` (no loss scaling): a disabled GradScaler; the forced overflow's "
        "step is applied, as Apex did",
    ),
    Case(
        "line-breaks-in-comments",
        "line_breaks_in_comments.py",
        ("--corrupt-step", "4"),
        covers="form feeds, U+2028/U+2029 and U+0085 in comments and docstrings (a U+2028 "
        "between the classifier's step and the temperature's `scale_loss`); one loss "
        "scaler for both; an overflow per epoch",
        min_skipped=3,
    ),
    Case(
        "trainer-package",
        "trainer_package",
        ("--corrupt-step", "7", "--checkpoint", "{dir}/ckpt.pt"),
        covers="a project: `amp.initialize` in an optimizer factory module, `scale_loss`, "
        "`master_params` and the step in a Trainer module, `amp.state_dict()` in a "
        "checkpoint module; one overflow",
        min_skipped=1,
    ),
    Case(
        "fp16-optimizer-static",
        "fp16_optimizer_flow.py",
        covers="`apex.fp16_utils`: `network_to_half` + `FP16_Optimizer(static_loss_scale=128)`, "
        "`optimizer.backward`, `clip_master_grads`, `optimizer.loss_scale` (fp16 weights "
        "with fp32 masters vs fp32 weights under autocast)",
        expect="tolerance",
        tolerance=Tolerance(loss_rel=5e-3, param_rel=1e-2, converge=0.9),
        scales="own",
    ),
    Case(
        "fp16-optimizer-dynamic-overflow",
        "fp16_optimizer_flow.py",
        ("--dynamic-loss-scale", "--corrupt-step", "9"),
        covers="`FP16_Optimizer(dynamic_loss_scale=True, dynamic_loss_args=...)` with a forced "
        "overflow: the same skipped step and final loss scale",
        expect="tolerance",
        tolerance=Tolerance(loss_rel=5e-3, param_rel=1e-2, converge=0.9),
        scales="own",
    ),
    Case(
        "flags-opt-level-dynamic",
        "opt_level_and_loss_scale_flags.py",
        ("--half", "--loss-scale", "dynamic", "--corrupt-step", "7"),
        covers='`opt_level="O1" if args.half else "O0"` and a run-time `loss_scale` '
        '("dynamic" here): `enabled=args.half`, GradScaler defaults; one overflow',
        min_skipped=1,
    ),
    Case(
        "flags-opt-level-static-128",
        "opt_level_and_loss_scale_flags.py",
        ("--half", "--loss-scale", "128"),
        covers="the same flags with `--loss-scale 128`: `init_scale=float(args.loss_scale)`, "
        "a scale that never grows",
    ),
    Case(
        "flags-opt-level-static-128-overflow",
        "opt_level_and_loss_scale_flags.py",
        ("--half", "--loss-scale", "128", "--corrupt-step", "7"),
        covers="`--loss-scale 128` with a forced overflow: the documented AMP111 difference",
        expect="static-overflow",
    ),
    Case(
        "flags-opt-level-unit-scale",
        "opt_level_and_loss_scale_flags.py",
        ("--half", "--loss-scale", "1.0", "--corrupt-step", "7"),
        covers="`--loss-scale 1.0`: the scaler is disabled by its `enabled=` expression, autocast "
        "stays on; the overflowing step is applied as Apex did",
    ),
    Case(
        "flags-opt-level-off",
        "opt_level_and_loss_scale_flags.py",
        ("--loss-scale", "128"),
        covers="the flags without `--half`: O0, scaler and autocast disabled",
    ),
    Case(
        "flags-opt-level-none-half",
        "opt_level_and_loss_scale_flags.py",
        ("--half", "--loss-scale", "none", "--corrupt-step", "7"),
        covers="a run-time `loss_scale` of None at O1: the level's dynamic default "
        "(`enabled=... or (args.half if args.loss_scale is None else ...)`); one overflow",
        min_skipped=1,
    ),
    Case(
        "flags-opt-level-none-off",
        "opt_level_and_loss_scale_flags.py",
        ("--loss-scale", "none"),
        covers="a run-time `loss_scale` of None at O0: the level's static 1.0, so the scaler is "
        "disabled as Apex did not scale",
    ),
    Case(
        "imagenet-flags-O1-default-scale",
        "imagenet_style_option_flags.py",
        ("--opt-level", "O1", "--corrupt-step", "9"),
        covers="Apex's ImageNet flags as strings: run-time `opt_level` and `loss_scale` (None, "
        "O1's dynamic default), `keep_batchnorm_fp32` dropped; one overflow",
        min_skipped=1,
    ),
    Case(
        "imagenet-flags-O1-static-text",
        "imagenet_style_option_flags.py",
        ("--opt-level", "O1", "--loss-scale", "128.0"),
        covers="the same flags with `--loss-scale 128.0` (text): `init_scale=float(...)`, a scale "
        "that never grows",
    ),
    Case(
        "imagenet-flags-O0-default-scale",
        "imagenet_style_option_flags.py",
        ("--opt-level", "O0"),
        covers="the same flags at O0 with no `--loss-scale`: O0's static 1.0, scaler and autocast disabled",
    ),
    Case(
        "forward-through-wrapper-attribute-fp16",
        "forward_through_wrapper_attribute.py",
        ("--fp16", "--corrupt-step", "8"),
        covers="the forward runs through `self.mnetwork` (a DataParallel around the `initialize`d "
        "model), so no model use is visible: autocast covers the statements the loss "
        "comes from, forward included; one overflow",
        min_skipped=1,
    ),
    Case(
        "forward-through-wrapper-attribute-fp32",
        "forward_through_wrapper_attribute.py",
        ("--corrupt-step", "8"),
        covers="the same trainer without fp16: scaler and autocast disabled",
        scales="native_disabled",
    ),
    Case(
        "imagenet-flags-O0-dynamic",
        "imagenet_style_option_flags.py",
        ("--opt-level", "O0", "--loss-scale", "dynamic"),
        covers="O0 with `--loss-scale dynamic`: Apex scaled fp32 losses dynamically; the scaler "
        "on, autocast off",
    ),
    Case(
        "fp16-flag-across-functions-on",
        "fp16_flag_across_functions.py",
        ("--fp16", "--corrupt-step", "5"),
        covers="`if args.fp16: amp.initialize(...)` in `main()`, `scale_loss` in `train_step()` "
        "called through `train_epoch()`, `amp.state_dict()` read in `log_state()`: the "
        "scaler built with `enabled=args.fp16` and passed down as a parameter; overflow "
        "forced",
        min_skipped=1,
    ),
    Case(
        "fp16-flag-across-functions-off",
        "fp16_flag_across_functions.py",
        ("--corrupt-step", "5"),
        covers="the same script without `--fp16`: Apex never initialised (no loss scaler "
        "to record), the threaded scaler disabled",
        scales="native_disabled",
    ),
    Case(
        "apex-optional-import",
        "apex_optional_import.py",
        ("--corrupt-step", "7"),
        covers="Apex imported in `try:` with `amp = None` on ImportError, `if use_amp and amp is "
        "None: raise` (answered natively: AMP905), `initialize` under `if use_amp:` in a "
        "Trainer method; one overflow",
        min_skipped=1,
    ),
    Case(
        "kfold-initialize-per-fold",
        "kfold_initialize_per_fold.py",
        ("--corrupt-step", "6"),
        covers="k-fold loop with a fresh `amp.initialize` per fold (one branch per `--mode`, each "
        "with its own `initialize`): a GradScaler built per fold, so every fold starts at "
        "the initial scale as Apex's rebuilt scaler did (every fold skips its first steps "
        "while the scale backs off); an overflow per fold. The recorder lists every "
        "GradScaler created, so scales are compared through the skipped steps only",
        min_skipped=6,
        scales="own",
    ),
    Case(
        "kfold-initialize-per-fold-unscaled",
        "kfold_initialize_per_fold.py",
        ("--mode", "unscaled", "--corrupt-step", "6"),
        covers="the other branch: `loss_scale=1.0` per fold, a disabled scaler each; the "
        "overflowing steps applied as Apex did",
        scales="own",
    ),
    Case(
        "optimizer-class-alias",
        "optimizer_class_alias.py",
        ("--fused-sgd", "--corrupt-step", "7"),
        covers="`optim_name = optim.SGD`, `optim_name = FusedSGD` under a flag, then called with "
        "param groups (AMP481: `functools.partial(torch.optim.SGD, fused=True)`); one "
        "overflow",
        min_skipped=1,
    ),
    Case(
        "fp16-optimizer-conditional-on",
        "fp16_optimizer_conditional.py",
        ("--fp16", "--dynamic-loss-scale", "--corrupt-step", "9"),
        covers="`if args.fp16:` around `model.half()` and `FP16_Optimizer`, `if args.fp16: "
        "optimizer.backward(loss) else: loss.backward()`, clipping on the same flag "
        "(GradScaler and autocast `enabled=args.fp16`); one overflow",
        expect="tolerance",
        tolerance=Tolerance(loss_rel=5e-3, param_rel=1e-2, converge=0.9),
        scales="own",
    ),
    Case(
        "fp16-optimizer-conditional-off",
        "fp16_optimizer_conditional.py",
        ("--corrupt-step", "9"),
        covers="the same script without `--fp16`: plain fp32 training, the scaler disabled",
        scales="native_disabled",
    ),
    Case(
        "apex-or-native-flag-apex",
        "apex_or_native_amp_flag.py",
        ("--amp", "apex", "--corrupt-step", "6"),
        covers="a script with both paths behind `--amp` (Apex's, torch's own GradScaler, fp32): "
        'the Apex path gets its own scaler with `enabled=args.amp == "apex"` and its '
        "`if`/`else` backward collapses; run with `--amp apex` and an overflow",
        min_skipped=1,
    ),
    Case(
        "apex-or-native-flag-none",
        "apex_or_native_amp_flag.py",
        ("--amp", "none", "--corrupt-step", "6"),
        covers="the same script in fp32 (`--amp none`): Apex never initialised, the migrated "
        "path's scaler disabled",
        scales="native_disabled",
    ),
    Case(
        "fp16-flag-under-main-block-on",
        "fp16_flag_under_main_block.py",
        ("--fp16", "--corrupt-step", "5"),
        covers='`if args.fp16: amp.initialize(...)` in the script\'s `if __name__ == "__main__":` '
        "block, `scale_loss` and `amp.state_dict()` in a module-level function: a global "
        "scaler built before the `if` with `enabled=args.fp16`; overflow forced",
        min_skipped=1,
    ),
    Case(
        "fp16-flag-under-main-block-off",
        "fp16_flag_under_main_block.py",
        ("--corrupt-step", "5"),
        covers="the same script without `--fp16`: the global scaler disabled",
        scales="native_disabled",
    ),
    Case(
        "kfold-train-function-fp16",
        "kfold_train_function.py",
        ("--fp16", "--corrupt-step", "6"),
        covers="a fresh `amp.initialize` per fold under `if args.fp16:`, `scale_loss` in "
        "`train_one_epoch(..., args.fp16, ...)`: a scaler built per fold and passed down, "
        "the `if fp16:` backward collapsed (its `fp16` is the caller's `args.fp16`); every "
        "fold skips its first steps, plus an overflow. Scales compared through the steps "
        "(the recorder lists every GradScaler created)",
        min_skipped=6,
        scales="own",
    ),
    Case(
        "kfold-train-function-fp32",
        "kfold_train_function.py",
        ("--corrupt-step", "6"),
        covers="the same script without `--fp16`: each fold's scaler disabled (scales not "
        "compared: one disabled GradScaler per fold)",
        scales="own",
    ),
    Case(
        "start-scale-after-initialize-fp16",
        "start_scale_after_initialize.py",
        ("--fp16", "--accum", "1", "--corrupt-step", "25"),
        covers="`amp._amp_state.loss_scalers[0]._loss_scale = 2**20` right after a guarded "
        "`initialize` with a run-time `opt_level`: `GradScaler(init_scale=2**20, ...)`; the "
        "start overflows the fp16 backward for several steps, plus a forced overflow; "
        "master params clipped before each step",
        min_skipped=3,
        unsafe="U1",
    ),
    Case(
        "start-scale-after-initialize-fp32",
        "start_scale_after_initialize.py",
        ("--corrupt-step", "25"),
        covers="the same script without `--fp16`: Apex never initialised, the scaler disabled",
        scales="native_disabled",
        unsafe="U1",
    ),
    Case(
        "factory-package-resume",
        "factory_package",
        covers="a project, the Trainer module importing the optimizer factory module that runs "
        "`amp.initialize` (through a helper, under `if fp16:`): the factory keeps the "
        "GradScaler global, the Trainer reads it through the module; `master_params` "
        "clipping, a schedule, `amp.state_dict()` saved and loaded by the Trainer in a "
        "new process; an overflow in each phase",
        min_skipped=2,
        phases=(
            ("--fp16", "--steps", "12", "--corrupt-step", "4", "--checkpoint", "{dir}/ckpt.pt"),
            ("--fp16", "--steps", "24", "--corrupt-step", "17", "--checkpoint", "{dir}/ckpt.pt", "--resume"),
        ),
    ),
    Case(
        "script-trainer-resume",
        "script_trainer",
        covers="a project, the script running `amp.initialize(enabled=args.fp16)` and importing a "
        "Trainer module and a checkpoint helper: the script sets the GradScaler as both "
        "modules' attribute; `scale_loss` and `master_params` in the Trainer, "
        "`amp.state_dict()`/`load_state_dict` in the helper, resumed in a new process; an "
        "overflow in each phase",
        min_skipped=2,
        phases=(
            ("--fp16", "--steps", "10", "--corrupt-step", "3", "--output", "{dir}/out"),
            ("--fp16", "--steps", "20", "--corrupt-step", "14", "--output", "{dir}/out", "--resume"),
        ),
    ),
    Case(
        "script-trainer-fp32",
        "script_trainer",
        ("--steps", "20", "--corrupt-step", "3", "--output", "{dir}/out"),
        covers="the same project without `--fp16`: `initialize(enabled=False)`, the shared "
        "scaler disabled, autocast off in the Trainer",
        scales="native_disabled",
    ),
    Case(
        "warm-up-step",
        "warm_up_step.py",
        ("--fp16", "--corrupt-step", "9"),
        covers="`if global_step == 0: optimizer.step()` after `initialize` and before any "
        "backward: kept as the optimizer's own step (no inf check for `scaler.step` to "
        "read); then the loop with a forced overflow",
        min_skipped=1,
    ),
    Case(
        "opt-level-option-as-guard-O1",
        "opt_level_option_as_guard.py",
        ("--opt-level", "O1", "--corrupt-step", "6"),
        covers="`if args.opt_level:` guards Apex (the option is the switch and the level): "
        "`enabled=bool(args.opt_level) and ...`; one overflow",
        min_skipped=1,
    ),
    Case(
        "opt-level-option-as-guard-unset",
        "opt_level_option_as_guard.py",
        (),
        covers="the same script with `--opt-level` unset (None): the switch is False, not None "
        "(torch.autocast accepts only a bool); no loss scaler to record, the native one "
        "disabled",
        scales="native_disabled",
    ),
    Case(
        "flag-guarded-builder-O1",
        "flag_guarded_builder",
        ("--fp16", "--opt-level", "O1", "--corrupt-step", "5"),
        covers="a project: `if apex and args.fp16: <scale_loss> else: loss.backward()` in the "
        "script, `apex` an import-success flag, `initialize` under `if args.fp16:` in "
        "another module's builder given the same `args`: one scaled backward through the "
        "builder module's scaler; one overflow",
        min_skipped=1,
    ),
    Case(
        "flag-guarded-builder-O0",
        "flag_guarded_builder",
        ("--fp16", "--opt-level", "O0", "--corrupt-step", "5"),
        covers="the same project at O0: Apex's static scale 1.0, the shared scaler disabled",
        scales="native_disabled",
    ),
    Case(
        "flag-guarded-builder-fp32",
        "flag_guarded_builder",
        ("--corrupt-step", "5"),
        covers="the same project without `--fp16`: Apex never initialised, the branch's plain "
        "backward is the disabled scaler's",
        scales="native_disabled",
    ),
    Case(
        "script-config-fitter-O1",
        "script_config_fitter",
        ("--fp16", "--opt-level", "O1", "--corrupt-step", "5"),
        covers="a project: the script's config class gives `initialize` a run-time `opt_level` and "
        "`loss_scale` and sets the Fitter module's scaler and its amp switch apart "
        "(`amp_enabled`); dynamic scale, one overflow",
        min_skipped=1,
    ),
    Case(
        "script-config-fitter-O1-unit-scale",
        "script_config_fitter",
        ("--fp16", "--opt-level", "O1", "--loss-scale", "1.0"),
        covers="the same project with a static scale of 1.0: Apex cast without scaling; the "
        "Fitter's autocast on, the scaler disabled",
        scales="native_disabled",
    ),
    Case(
        "script-config-fitter-O0-scale",
        "script_config_fitter",
        ("--fp16", "--opt-level", "O0", "--loss-scale", "128"),
        covers="the same project at O0 with a static scale of 128: Apex scaled fp32 losses "
        "without casting; the scaler enabled at 128, the Fitter's autocast off",
    ),
    Case(
        "branch-clip-master-or-model-O1",
        "branch_clip_master_or_model.py",
        ("--fp16", "--opt-level", "O1", "--corrupt-step", "6"),
        covers="`if fp16: <scale_loss>; clip(amp.master_params(opt)) else: loss.backward(); "
        "clip(model.parameters())` on the scaler's own switch: the branches stay apart "
        "(`unscale_` before the fp16 clip); one overflow",
        min_skipped=1,
    ),
    Case(
        "branch-clip-master-or-model-fp32",
        "branch_clip_master_or_model.py",
        ("--corrupt-step", "6"),
        covers="the same `fit` without fp16: only the plain branch runs, the scaler disabled",
        scales="native_disabled",
    ),
    Case(
        "flag-attribute-trainer-amp",
        "flag_attribute_trainer.py",
        ("--use-amp", "--corrupt-step", "7"),
        covers="a Trainer storing `self.use_amp = use_amp`, `initialize` under `use_amp` in its "
        "constructor, `if self.use_amp: <scale_loss> else: loss.backward()` in its loop: one "
        "scaled backward on `self.scaler`; one overflow",
        min_skipped=1,
    ),
    Case(
        "flag-attribute-trainer-fp32",
        "flag_attribute_trainer.py",
        ("--corrupt-step", "7"),
        covers="the same Trainer without amp: the plain backward is the disabled scaler's",
        scales="native_disabled",
    ),
    Case(
        "objectives-initialize-loop-O1",
        "objectives_initialize_loop.py",
        ("--fp16", "--corrupt-step", "5"),
        covers="`amp.initialize` once per objective in a loop under `if fp16:` (the last call's "
        "fresh scaler serves all), then round-robin steps with `if fp16: <scale_loss>; "
        "clip(master params) else: ...`: one GradScaler before the `if`, updated after each "
        "objective's step; an overflow in objective 1",
        min_skipped=1,
    ),
    Case(
        "objectives-initialize-loop-fp32",
        "objectives_initialize_loop.py",
        ("--corrupt-step", "5"),
        covers="the same training without fp16: the scaler disabled",
        scales="native_disabled",
    ),
    Case(
        "apex-flag-branch-initialize-O1",
        "apex_flag_branch_initialize.py",
        ("--amp-level", "O1", "--corrupt-step", "6"),
        covers="`if args.amp_level: if APEX_OK: <initialize> else: logger.warning(...)`, APEX_OK set "
        "True by the Apex import's `try:` (AMP158): the scaler built under `if args.amp_level:` "
        "alone, the backward's `if amp_level and APEX_OK:` collapsed; one overflow",
        min_skipped=1,
    ),
    Case(
        "apex-flag-branch-initialize-off",
        "apex_flag_branch_initialize.py",
        ("--corrupt-step", "6"),
        covers="the same trainer with no opt level: the `if` around the flag branch never runs, "
        "the scaler disabled",
        scales="native_disabled",
    ),
    Case(
        "flag-branch-factory-O1",
        "flag_branch_factory",
        ("--amp-level", "O1", "--corrupt-step", "5"),
        covers="a project: an optimizer factory calls `initialize` under `if amp_level and optimizer: "
        "if APEX_OK: ... else: logger.warning(...)` (AMP158), a Trainer module scales and clips "
        "the master gradients through the factory's global GradScaler; one overflow",
        min_skipped=1,
    ),
    Case(
        "flag-branch-factory-O0",
        "flag_branch_factory",
        ("--amp-level", "O0", "--corrupt-step", "5"),
        covers="the same project at O0 (amp off; with no level at all Apex's unconditional "
        "`scale_loss` raises): the factory's scaler and `amp_enabled` off, fp32 throughout",
        scales="native_disabled",
    ),
    Case(
        "factory-options-trainer-O1",
        "factory_options_trainer",
        ("--opt-level", "O1", "--corrupt-step", "5"),
        covers="a project: an optimizer factory calls `initialize` with a run-time level and loss "
        "scale, a Trainer reads the GradScaler and `amp_enabled` from the factory module; "
        "dynamic scale, one overflow",
        min_skipped=1,
    ),
    Case(
        "factory-options-trainer-O1-unit-scale",
        "factory_options_trainer",
        ("--opt-level", "O1", "--loss-scale", "1.0"),
        covers="the same project with a static scale of 1.0: the Trainer's autocast on, the scaler disabled",
        scales="native_disabled",
    ),
    Case(
        "factory-options-trainer-O0-scale",
        "factory_options_trainer",
        ("--opt-level", "O0", "--loss-scale", "128"),
        covers="the same project at O0 with a static scale of 128: scaled, no autocast",
    ),
    Case(
        "switch-argument-trainer-O1",
        "switch_argument_trainer",
        ("--fp16", "--opt-level", "O1", "--corrupt-step", "5"),
        covers="a project: `train_net(args, config)` calls `initialize` under `if config.fp16:` and "
        "hands the same test to the loop module's `fit(..., fp16=config.fp16)`, whose "
        "`if fp16: <scale_loss> else: loss.backward()` and `if fp16:` master-params clip "
        "follow the entry's GradScaler; an inference-only `initialize` in a program of its "
        "own beside it does not compete; one overflow",
        min_skipped=1,
    ),
    Case(
        "switch-argument-trainer-fp32",
        "switch_argument_trainer",
        ("--corrupt-step", "5"),
        covers="the same project without `--fp16`: Apex never initialised, the loop's plain "
        "backward and model-parameter clip are the disabled scaler's",
        scales="native_disabled",
    ),
    Case(
        "inverted-backward-branch-fp16",
        "inverted_backward_branch.py",
        ("--fp16", "--corrupt-step", "6"),
        covers="`if not args.fp16: loss.backward() else: <scale_loss>` on the scaler's own switch: "
        "the branches stay apart; one overflow",
        min_skipped=1,
    ),
    Case(
        "inverted-backward-branch-fp32",
        "inverted_backward_branch.py",
        ("--corrupt-step", "6"),
        covers="the same script without `--fp16`: only the plain branch runs, the scaler disabled",
        scales="native_disabled",
    ),
    Case(
        "opt-level-o0-plain-backward-O1",
        "opt_level_o0_plain_backward.py",
        ("--opt-level", "O1", "--corrupt-step", "6"),
        covers='`if self.opt_level == "O0": loss.backward() else: <scale_loss>` in a trainer, the '
        'scaler built with `enabled=self.opt_level != "O0"`: the branches stay apart; one overflow',
        min_skipped=1,
    ),
    Case(
        "opt-level-o0-plain-backward-O0",
        "opt_level_o0_plain_backward.py",
        ("--opt-level", "O0"),
        covers="the same trainer at O0: only the plain branch runs, the scaler disabled",
        scales="native_disabled",
    ),
    Case(
        "two-forwards-two-scaled-backwards-fp16",
        "two_forwards_then_two_scaled_backwards.py",
        ("--fp16", "--corrupt-step", "7"),
        covers="a main and an auxiliary loss, both forwards before either scaled backward into one "
        "optimizer: one autocast region over both forwards; an overflow in the auxiliary loss",
        min_skipped=1,
        unsafe="U1",
    ),
    Case(
        "two-forwards-two-scaled-backwards-both-overflow",
        "two_forwards_then_two_scaled_backwards.py",
        ("--fp16", "--corrupt-both-step", "7"),
        covers="the same script, both losses of one iteration overflowing: Apex halved its scale at "
        "each `scale_loss` exit (twice), the GradScaler halves once at the step (AMP216, an unsafe "
        "fix: docs/differences.md entry U1); losses, skips and parameters equal, the scales a factor "
        "2 apart from that step on",
        expect="documented",
        min_skipped=1,
        unsafe="U1",
    ),
    Case(
        "two-forwards-two-scaled-backwards-fp32",
        "two_forwards_then_two_scaled_backwards.py",
        covers="the same script without `--fp16`: plain backwards, the scaler disabled",
        scales="native_disabled",
        unsafe="U1",
    ),
    Case(
        "module-handed-as-value-resume",
        "module_handed_as_value.py",
        covers="`from apex import amp` in `main()` only with an opt level (`amp = None` otherwise), the module "
        "passed to `train()` (`if amp is not None:` around `scale_loss`, `if amp:` clipping "
        "`amp.master_params`) and saved as `amp.state_dict() if amp else None`: the scaler "
        "takes the value's place; resumed in a new process from the checkpoint holding its "
        "state; an overflow in each phase",
        min_skipped=2,
        phases=(
            ("--amp-level", "O1", "--epochs", "2", "--corrupt-step", "3", "--checkpoint", "{dir}/ckpt.pt"),
            (
                "--amp-level",
                "O1",
                "--epochs",
                "4",
                "--corrupt-step",
                "15",
                "--checkpoint",
                "{dir}/ckpt.pt",
                "--restore",
            ),
        ),
    ),
    Case(
        "module-handed-as-value-O0",
        "module_handed_as_value.py",
        ("--amp-level", "O0", "--epochs", "4", "--corrupt-step", "3"),
        covers="the same script at O0: Apex set up but scaling nothing, `if amp:` true where "
        "the native `scaler.is_enabled()` is false (same clipping, same steps); the scaler "
        "disabled",
        scales="native_disabled",
    ),
    Case(
        "inference-only-initialize-O1",
        "inference_only_initialize.py",
        ("--fp16", "--opt-level", "O1"),
        covers="`if args.fp16: model = amp.initialize(model, opt_level=...)` with no optimizer after "
        "fp32 training: logits, a loss, a matmul and a softmax on them in a function that "
        "receives the model, all under the autocast region after `initialize`; the scaler "
        "Apex built is never used (scales not compared)",
        scales="own",
    ),
    Case(
        "inference-only-initialize-O0",
        "inference_only_initialize.py",
        ("--fp16", "--opt-level", "O0"),
        covers="the same evaluation at O0: the region's autocast is disabled",
        scales="own",
    ),
    Case(
        "ema-second-initialize",
        "ema_second_initialize.py",
        ("--amp", "--moco", "--opt-level", "O1", "--corrupt-step", "7"),
        covers="a second `amp.initialize` for an EMA (key) model with a dummy never-stepped SGD, "
        "nested after the training one with the same options: dropped; the EMA forward "
        "in the training autocast region, its outputs printed; momentum update after each "
        "step; one overflow",
        min_skipped=1,
    ),
    Case(
        "train-or-infer-branches",
        "train_or_infer_branches.py",
        ("--fp16", "--corrupt-step", "5", "--evaluate", "--checkpoint", "tagger.pt"),
        covers="a training `initialize` in `start_training` and an inference one (no optimizer, "
        "`enabled=cfg.fp16`, run-time level) in `start_inference`, which the entry calls as "
        "its last statement: trained with an overflow, saved, then scored under the region "
        "after the inference `initialize` (scales not compared: Apex rebuilt an unused scaler)",
        scales="own",
        min_skipped=1,
    ),
    Case(
        "trainer-fit-and-lr-find-resume",
        "trainer_fit_and_lr_find.py",
        covers="a learner class whose `fit()` and `lr_find()` each call `amp.initialize` under "
        "`if self.fp16:`; `lr_find` scales in a helper method only it calls, `fit` saves and "
        "loads `amp.state_dict()` through methods it calls: each `initialize` sets "
        "`self.scaler`, fresh scale at each; resumed in a new process; overflows forced",
        min_skipped=2,
        scales="newest",
        phases=(
            ("--fp16", "--lr-find", "--epochs", "1", "--corrupt-step", "5", "--checkpoint", "{dir}/ckpt.pt"),
            (
                "--fp16",
                "--lr-find",
                "--epochs",
                "2",
                "--corrupt-step",
                "3",
                "--checkpoint",
                "{dir}/ckpt.pt",
                "--resume",
            ),
        ),
    ),
    Case(
        "trainer-fit-and-lr-find-O0",
        "trainer_fit_and_lr_find.py",
        ("--fp16", "--opt-level", "O0", "--lr-find"),
        covers="the same learner at O0: both scalers disabled, nothing skipped",
        scales="newest",
    ),
    Case(
        "task-test-only-or-training-resume",
        "task_test_only_or_training.py",
        covers="`if self.test_only: model = amp.initialize(model) else: model, opt = "
        "amp.initialize(model, opt)` in `prepare()` (exactly one runs: one scaler, "
        "`self.scaler` in each arm), `scale_loss` in `train_step()` and "
        "`amp.state_dict()`/`load_state_dict` in checkpoint methods the script calls; "
        "resumed in a new process; an overflow in each phase",
        min_skipped=2,
        phases=(
            ("--steps", "12", "--corrupt-step", "4", "--checkpoint", "{dir}/ckpt.pt"),
            ("--steps", "24", "--corrupt-step", "17", "--checkpoint", "{dir}/ckpt.pt", "--resume"),
        ),
    ),
    Case(
        "task-test-only-or-training-O0",
        "task_test_only_or_training.py",
        ("--opt-level", "O0", "--steps", "24"),
        covers="the same task at O0: the scaler disabled",
        scales="native_disabled",
    ),
    Case(
        "module-handed-to-helper-resume",
        "module_handed_to_helper",
        covers="a project: `from apex import amp` in the script only with an opt level (`amp = None` "
        "otherwise), the module passed to `train_epoch()` and to the package's "
        "`load_checkpoint(path, model, optimizer, amp)`, which restores `amp.load_state_dict` "
        'under `if amp and "amp" in state:`; the scaler takes both slots; resumed in a new '
        "process; an overflow in each phase",
        min_skipped=2,
        phases=(
            ("--amp-level", "O1", "--steps", "12", "--corrupt-step", "4", "--checkpoint", "{dir}/ckpt.pt"),
            (
                "--amp-level",
                "O1",
                "--steps",
                "24",
                "--corrupt-step",
                "17",
                "--checkpoint",
                "{dir}/ckpt.pt",
                "--restore",
            ),
        ),
    ),
    Case(
        "module-handed-to-helper-O0-resume",
        "module_handed_to_helper",
        covers="the same project at O0: Apex set up but scaling nothing saves and restores its state "
        "(`if amp` true), the disabled scaler saves none and its load is skipped; the same "
        "steps across the resume",
        scales="native_disabled",
        phases=(
            ("--amp-level", "O0", "--steps", "12", "--corrupt-step", "4", "--checkpoint", "{dir}/ckpt.pt"),
            (
                "--amp-level",
                "O0",
                "--steps",
                "24",
                "--corrupt-step",
                "17",
                "--checkpoint",
                "{dir}/ckpt.pt",
                "--restore",
            ),
        ),
    ),
    Case(
        "provided-amp-module-O1",
        "provided_amp_module",
        ("--fp16", "--opt-level", "O1", "--corrupt-step", "4"),
        covers="a project: the trainer gets Apex's module from a helper, `amp = get_amp_module(fp16)` (the "
        "helper imports it under `if fp16:` in a `try` that only raises, None otherwise), sets it up "
        "under `if fp16 and amp:` and hands it to the epoch runner, which scales and clips "
        "`amp.master_params` under `if amp:`; the call becomes the scaler, the helper goes; one "
        "overflow",
        min_skipped=1,
    ),
    Case(
        "provided-amp-module-fp32",
        "provided_amp_module",
        ("--corrupt-step", "4"),
        covers="the same project without `--fp16`: the helper returned None (Apex never imported), "
        "the scaler is disabled",
        scales="native_disabled",
        apex_unused=True,
    ),
    Case(
        "loss-helper-forward-in-caller-fp16",
        "loss_helper_forward_in_caller.py",
        ("--fp16", "--corrupt-step", "4"),
        covers="a module-level `optimizer_step(loss, optimizer, model, schedule, args, is_update)` "
        "that scales the loss it is given (`if args.fp16:` around `scale_loss` and the "
        "`amp.master_params` clip, the step under `is_update`), called by the loop right "
        "after its forward with `loss / accumulate`; `initialize` under `if args.fp16:` in "
        "the entry block: autocast around the caller's forward, the global scaler in the "
        "helper; accumulation over 2 micro-batches, an overflow on a micro-batch that does "
        "not step: losses, steps, skips and parameters equal; the scale read inside that "
        "window is not (Apex backed off at the micro-batch's exit, the GradScaler at the "
        "step: AMP215), and equal again from the step on",
        min_skipped=1,
        scales="own",
        unsafe="U1",
    ),
    Case(
        "loss-helper-forward-in-caller-fp16-update-overflow",
        "loss_helper_forward_in_caller.py",
        ("--fp16", "--accumulate", "3", "--corrupt-step", "8"),
        covers="the same helper, 3 micro-batches per step, the overflow on a micro-batch that steps",
        min_skipped=1,
        unsafe="U1",
    ),
    Case(
        "loss-helper-forward-in-caller-fp32",
        "loss_helper_forward_in_caller.py",
        ("--corrupt-step", "4"),
        covers="the same script without `--fp16`: the scaler disabled, autocast off",
        scales="native_disabled",
        unsafe="U1",
    ),
    Case(
        "loss-helper-threaded-two-losses-fp16",
        "loss_helper_threaded_two_losses.py",
        ("--fp16", "--corrupt-step", "7"),
        covers="`initialize` under `if args.fp16:` in `main()`; `apply_loss(loss, optimizer, args, "
        "do_step)` scales the loss it is given, called from a warm-up loop (a step every "
        "second call) and twice per iteration of the training loop (a main loss, then an "
        "auxiliary loss from a second forward after the first step): the scaler threaded "
        "as a parameter, one autocast region per call's forward; an overflow in one "
        "auxiliary loss",
        min_skipped=1,
        unsafe="U1",
    ),
    Case(
        "loss-helper-threaded-two-losses-fp32",
        "loss_helper_threaded_two_losses.py",
        ("--corrupt-step", "7"),
        covers="the same script without `--fp16`: the scaler disabled, autocast off",
        scales="native_disabled",
        unsafe="U1",
    ),
]

BY_ID = {case.id: case for case in CASES}

#: The program the quick tier (`pytest -m "not slow"`) runs its three ways; every other
#: program's runs are marked slow.
QUICK = ("convnet-O1",)


def case_param(case: Case, *marks):
    """`case` as a pytest parameter with its id, marked slow unless it is in QUICK."""
    import pytest

    slow = () if case.id in QUICK else (pytest.mark.slow,)
    return pytest.param(case, id=case.id, marks=(*marks, *slow))
