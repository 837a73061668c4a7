"""A zygote for the harness: import torch once, fork one child per run.

Importing torch and, through the first optimizer, torch._dynamo costs ~3 s of CPU per process;
the programs themselves run in well under a second. The harness starts one of these per worker
(without amp_shim imported and without the alias) and sends it jobs, one JSON line each:

    {"argv": [...], "shim": bool, "env": {...}, "cwd": ..., "stdout": path, "stderr": path,
     "timeout": seconds}

The child takes the job's environment, working directory and output files, then runs exactly
what the command line would: with "shim" it calls `amp_shim.launch.main(argv)`, the function
behind `python -m amp_shim argv...`; without, it runs argv[0] as `__main__` (`python argv...`).
The zygote answers with one JSON line, {"rc": exit status}. tests/equivalence checks that a
forked run and a fresh-interpreter run of the same program record identical results.
"""

import json
import os
import runpy
import signal
import sys

import torch  # noqa: F401 - the point: imported once, before the forks
import torch._dynamo  # noqa: F401 - imported by the first Optimizer() of every program
import torch.optim  # noqa: F401

assert "amp_shim" not in sys.modules and "apex" not in sys.modules


def _child(job) -> int:
    signal.alarm(int(job.get("timeout", 120)))
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    sys.argv = list(job["argv"])
    try:
        if job["shim"]:
            from amp_shim.launch import main

            code = main(job["argv"])
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(job["argv"][0]))
            runpy.run_path(job["argv"][0], run_name="__main__")
            code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def main() -> None:
    for line in sys.stdin:
        job = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(job)
            finally:
                os._exit(code if isinstance(code, int) else 1)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        sys.stdout.write(json.dumps({"rc": rc}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
