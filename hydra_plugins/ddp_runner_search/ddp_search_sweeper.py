"""``hydra/sweeper=ddp_search``: an Optuna search whose pruner stops a trial at a validation (ddp-runner's own
sweeper; the loop is :mod:`ddp_runner.job.search_sweeper`).

Hydra imports every module of the ``hydra_plugins`` namespace package at start-up: this one stays light (Optuna
and the loop are imported only when a search runs).
"""

# No ``from __future__ import annotations``: Hydra's plugin scan may run this module's body outside sys.modules,
# where a dataclass cannot resolve string annotations.
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper


@dataclass
class DDPSearchConf:
    """The settings of ``hydra/sweeper=ddp_search`` (``hydra.sweeper.<name>=…``)."""

    _target_: str = "hydra_plugins.ddp_runner_search.ddp_search_sweeper.DDPSearchSweeper"
    n_trials: int = 8
    # median | asha | hyperband | none (Optuna's pruners)
    pruner: str = "median"
    # median: trials that always run to their end first, and the steps before any trial is pruned
    startup_trials: int = 2
    warmup_steps: int = 0
    # asha / hyperband: the first rung's steps (null: Optuna's own choice)
    min_steps: Any = None
    # tpe | random | grid (every combination of the choice/range values once)
    sampler: str = "tpe"
    seed: Any = None
    # more of the search space, {key: "interval(1e-4,1)"} (beside the command line's sweep overrides)
    params: Any = None
    # a sweep directory whose search to continue (its study.journal and sweep.json)
    resume: Any = None


ConfigStore.instance().store(group="hydra/sweeper", name="ddp_search", node=DDPSearchConf, provider="ddp_runner")


class DDPSearchSweeper(Sweeper):
    """Asks Optuna for each trial and launches it as soon as a slot is free; the pruner stops trials early."""

    def __init__(self, n_trials: int = 8, pruner: str = "median", startup_trials: int = 2, warmup_steps: int = 0,
                 min_steps: Any = None, sampler: str = "tpe", seed: Any = None, params: Any = None,
                 resume: Any = None) -> None:
        self.n_trials, self.pruner, self.seed, self.resume = n_trials, str(pruner), seed, resume
        self.sampler = sampler
        self.startup_trials, self.warmup_steps, self.min_steps = startup_trials, warmup_steps, min_steps
        self.params = dict(params or {})
        self.config: Any = None
        self.launcher: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        """Keep the config and make the launcher (Hydra's basic one: it calls ddp-run's job function)."""
        from hydra.core.plugins import Plugins

        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> None:
        """Run the search."""
        from ddp_runner.job.search_sweeper import run

        run(self, arguments)
