"""Algorithms that break their contract on purpose, one way each (tests of check_algorithm and
of how a run reports what a user's code raises)."""

import numpy as np
from pydantic import BaseModel

from labalgos.clipped_pg import ClippedPG, ClippedPGConfig
from tianji_dask import Algorithm


class RaisesInLearn(ClippedPG):
    """Its update fails (a user's bug inside the learner)."""

    def learn(self):
        raise ZeroDivisionError("bug in my loss")


class RaisesInAct(ClippedPG):
    """Its acting fails after the first chunk (a user's bug inside an explorer)."""

    def act(self, obs, explore):
        if getattr(self, "acted", 0) > 3:
            raise KeyError("missing_extra")
        self.acted = getattr(self, "acted", 0) + 1
        return super().act(obs, explore)


class ForgetsWeights(ClippedPG):
    """set_weights does nothing: explorers keep their first policy."""

    def set_weights(self, weights):
        pass


class NoSamples(ClippedPG):
    """learn's metrics lack ``samples``."""

    def learn(self):
        metrics = super().learn()
        del metrics["samples"]
        return metrics


class IngestReturnsNothing(ClippedPG):
    """ingest returns None instead of the env steps kept."""

    def ingest(self, chunk, staleness):
        super().ingest(chunk, staleness)


class UnseededActing(ClippedPG):
    """Acting draws from a generator seed_acting does not reach: not replayable."""

    def seed_acting(self, seed):
        pass

    def act(self, obs, explore):
        self.rng = np.random.default_rng()
        return super().act(obs, explore)


class StateLoses(ClippedPG):
    """load_state_dict forgets the value network."""

    def load_state_dict(self, state):
        self.policy.load_state_dict(state["policy"])


class KeepsWhatItRefuses(ClippedPG):
    """ingest keeps chunks that accepts refuses as too stale."""

    def ingest(self, chunk, staleness):
        self.batch.append(chunk)
        return int(chunk["env_steps"])


class WantsMoreThanItSays(ClippedPG):
    """An on-policy update that needs two chunks while chunks_per_update says one: relaxed mode
    would hold one chunk and wait forever."""

    def ready(self):
        return len(self.batch) >= 2


class NoConfig(ClippedPG):
    """Names no hyperparameter model."""

    Config = None


class Unfinished(Algorithm):
    """Leaves the abstract methods unwritten."""

    Config = ClippedPGConfig


class PlainConfig(BaseModel):  # pydantic's default: unknown keys ignored, which the project refuses anyway
    lr: float = 1e-3


class PlainConfigPG(ClippedPG):
    Config = PlainConfig

    def __init__(self, obs_space, action_space, config, seed=0):
        super().__init__(obs_space, action_space, ClippedPGConfig(lr=config.lr), seed)
