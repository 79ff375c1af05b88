"""``bestofn:`` in a run's YAML: the method's config section."""

from pydantic import BaseModel, ConfigDict, Field


class BestOfNConfig(BaseModel):
    """bestofn's keys, validated with the rest of the file (an unknown key or a value out of bounds is an error)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sft_weight: float = Field(
        0.1, ge=0.0, le=10.0,
        description="Weight of the SFT term on each group's best answer, beside the policy term; 0: no SFT term.")
    min_reward: float = Field(
        1.0,
        description="A group's best answer is trained on only if its reward is at least this "
                    "(1.0 with the built-in tasks' 0/1 rewards: correct answers only).")
