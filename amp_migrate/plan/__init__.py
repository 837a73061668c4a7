"""The training planner: from a file's Apex calls as given, the plan for its GradScaler.

`types` holds what a plan is (`TrainingPlan`, `SharedScaler`, `InferenceRegion`, ...) and the
readers of `initialize`'s and `scale_loss`'s arguments; the other modules decide a plan: per
block (`units`), across a trainer's methods (`methods`), for inference-only models
(`inference`), from `initialize`'s options (`options`), through functions the scaler must be
handed to (`threaded`), and around run-time switches (`switch_flow`). Nothing here imports a
rule: the rules read the plan, the planner never reads the rules.
"""
