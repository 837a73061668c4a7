"""`apex.amp.lists`: Apex's O1 cast lists (`functional_overrides`, `torch_overrides`,
`tensor_overrides`), as data.

The shim's O1 is `torch.autocast`, whose own op lists decide the casts (docs/differences.md);
these modules keep Apex's lists importable and readable for code that inspects them. Editing
them has no effect on the shim's casts: register functions instead (`amp.register_*_function`).
"""
