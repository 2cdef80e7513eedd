"""The names runners log metrics and state under, as RLlib 2.60 spells them."""

DEFAULT_AGENT_ID = "default_agent"

# Metric keys, as RLlib 2.60 spells them (ray.rllib.utils.metrics).
NUM_ENV_STEPS_SAMPLED = "num_env_steps_sampled"
NUM_ENV_STEPS_SAMPLED_LIFETIME = "num_env_steps_sampled_lifetime"
NUM_AGENT_STEPS_SAMPLED = "num_agent_steps_sampled"
NUM_AGENT_STEPS_SAMPLED_LIFETIME = "num_agent_steps_sampled_lifetime"
NUM_MODULE_STEPS_SAMPLED = "num_module_steps_sampled"
NUM_MODULE_STEPS_SAMPLED_LIFETIME = "num_module_steps_sampled_lifetime"
NUM_EPISODES = "num_episodes"
NUM_EPISODES_LIFETIME = "num_episodes_lifetime"
EPISODE_LEN_MEAN = "episode_len_mean"
EPISODE_LEN_MIN = "episode_len_min"
EPISODE_LEN_MAX = "episode_len_max"
EPISODE_RETURN_MEAN = "episode_return_mean"
EPISODE_RETURN_MIN = "episode_return_min"
EPISODE_RETURN_MAX = "episode_return_max"
EPISODE_DURATION_SEC_MEAN = "episode_duration_sec_mean"
EPISODE_AGENT_RETURN_MEAN = "agent_episode_returns_mean"
EPISODE_MODULE_RETURN_MEAN = "module_episode_returns_mean"
# RLlib 2.60's single-agent runner spells these two without the "s" (literal strings
# there, not the constants above, which its multi-agent runner uses).
SA_AGENT_RETURN_MEAN = "agent_episode_return_mean"
SA_MODULE_RETURN_MEAN = "module_episode_return_mean"
EPISODE_AGENT_STEPS = "agent_steps"
WEIGHTS_SEQ_NO = "weights_seq_no"
SAMPLE_TIMER = "sample"
TIME_BETWEEN_SAMPLING = "time_between_sampling"
ENV_RESET_TIMER = "env_reset_timer"
ENV_STEP_TIMER = "env_step_timer"
ENV_TO_MODULE_CONNECTOR = "env_to_module_connector"
RLMODULE_INFERENCE_TIMER = "rlmodule_inference_timer"
MODULE_TO_ENV_CONNECTOR = "module_to_env_connector"
NUM_ENV_STEP_FAILURES_LIFETIME = "num_env_step_failures_lifetime"
# fastrollout's own: sub-envs recreated after a crash (RLlib has no such counter).
NUM_ENV_RESTARTS_LIFETIME = "num_env_restarts_lifetime"

# State keys, as RLlib 2.60 spells them.
COMPONENT_RL_MODULE = "rl_module"
COMPONENT_ENV_TO_MODULE_CONNECTOR = "env_to_module_connector"
COMPONENT_MODULE_TO_ENV_CONNECTOR = "module_to_env_connector"
