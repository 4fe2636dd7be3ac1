import envs
from envs.prompt import first_turn_messages, reward_message, system_message, turn_message


def test_messages_follow_ragens_format():
    env = envs.make("sokoban", max_actions_per_turn=3)
    obs, _ = env.reset(seed=0)
    system, user = first_turn_messages(env, obs, max_response_words=100)
    assert system["role"] == "system" and system["content"].startswith("You're a helpful assistant. You are solving")
    # RAGEN-2 ctx_manager: f"\nYou can make up to {max_actions_per_traj} actions, separated by ..." + "\n"
    assert system["content"].endswith(
        "Your available actions are:\nUp, Down, Left, Right\n"
        'You can make up to 10 actions, separated by the action separator " || "\n')
    per_turn = envs.make("sokoban", max_actions_per_turn=3, prompt_action_limit="per_turn")
    assert system_message(per_turn)["content"].endswith(
        'You can make up to 3 actions per turn, separated by the action separator " || "')
    assert user == {"role": "user", "content": (
        f"\nTurn 1:\nState:\n{obs}\nYou have 10 actions left. Always output: <think> [Your thoughts] </think> "
        "<answer> [your answer] </answer> with no extra text. Strictly follow this format. "
        "Max response length: 100 words (tokens).\n")}
    assert reward_message(-0.1) == {"role": "user", "content": "Reward:\n-0.1\n"}


def test_answer_only_mode_and_invalid_turn_warning():
    env = envs.make("frozen_lake", require_think=False)
    obs, _ = env.reset(seed=1)
    message = turn_message(env, 2, obs, previous_turn_invalid=True)["content"]
    assert "Always output: <answer> [your answer] </answer>" in message and "<think>" not in message
    assert "No valid action provided previously. Environment state remains the same." in message
    assert message.startswith("\nTurn 2:\nState:\n")


def test_actions_left_is_plural_whatever_the_count_as_in_ragen2():
    # RAGEN-2 ctx_manager: f"You have {turn['actions_left']} actions left." for any count.
    env = envs.make("countdown")
    obs, _ = env.reset(seed=0)
    assert "You have 1 actions left. Always output:" in turn_message(env, 1, obs)["content"]


def test_free_form_envs_list_no_actions():
    env = envs.make("countdown")
    env.reset(seed=0)
    assert "available actions" not in system_message(env)["content"]
