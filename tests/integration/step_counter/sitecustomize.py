"""Counts the optimizer steps a training process runs, from outside the code under test.

A test puts this folder on PYTHONPATH and names a file in MASCOT_TEST_STEP_LOG; Python then loads
this module at start-up. When transformers' trainer callbacks are imported, every optimizer step's
number (`on_step_end` fires once per step) is appended to that file. A run resumed from the
checkpoint of step k writes k+1, k+2, ...; a run that started over would write 1, 2, ...
Beside it, `<log>.processes` gets a line per step and training process: its pid, its process index and
world size as the trainer sees them, the trainer's arguments class and the step.

With MASCOT_TEST_FAIL_AT_STEP=k as well, the first training to reach step k raises there, once per
log file (before that step's checkpoint is saved), as a crash inside a training task would.
"""

import importlib.abc
import importlib.machinery
import os
import sys

LOG = os.environ.get("MASCOT_TEST_STEP_LOG")
FAIL_AT = int(os.environ.get("MASCOT_TEST_FAIL_AT_STEP", "0"))


class _CountSteps(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "transformers.trainer_callback":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            step_end = module.CallbackHandler.on_step_end

            def counted(handler, args, state, control):
                with open(LOG, "a") as log:
                    log.write(f"{state.global_step}\n")
                with open(f"{LOG}.processes", "a") as log:
                    log.write(f"{os.getpid()} {args.process_index} {args.world_size} {type(args).__name__} "
                              f"{state.global_step}\n")
                failed = f"{LOG}.failed"
                if state.global_step == FAIL_AT and not os.path.exists(failed):
                    open(failed, "w").close()
                    raise RuntimeError(f"injected failure at step {FAIL_AT}")
                return step_end(handler, args, state, control)

            module.CallbackHandler.on_step_end = counted

        spec.loader.exec_module = exec_module
        return spec


if LOG:
    sys.meta_path.insert(0, _CountSteps())
