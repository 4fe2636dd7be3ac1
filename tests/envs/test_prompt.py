import pytest

import envs
from envs.prompt import after_turn, first_turn_messages, reward_message, reward_text, system_message, turn_message


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


def _sokoban(rows, **config):
    env = envs.make("sokoban", max_actions_per_turn=3, **config)
    env.load_room(rows)
    return env


ROOM = ["######",
        "#PXO_#",
        "#____#",
        "######"]


def test_reward_message_shows_ragen2s_env_reward_without_the_penalty():
    # RAGEN-2 es_manager: acc_reward = 0 + each executed action's reward, penalty kept apart;
    # ctx_manager writes f"Reward:\n{acc_reward}\n", so str() of that sum.
    env = _sokoban(ROOM)
    step = lambda text: env.step(f"<think>t</think><answer>{text}</answer>")
    _, reward, _, _, info = step("Jump")  # nothing ran: trained on the penalty, shown int 0
    assert reward == pytest.approx(-0.1) and reward_text(env, reward, info) == "0"
    _, reward, _, _, info = step("Down || Jump")  # one step (-0.1), one invalid piece (-0.1 penalty)
    assert reward == pytest.approx(-0.2) and reward_text(env, reward, info) == "-0.1"
    _, reward, _, _, info = step("Up || Down")  # -0.1 + -0.1 as floats: -0.2
    assert reward_text(env, reward, info) == "-0.2"
    _, reward, terminated, _, info = step("Up || Right")  # -0.1, then push onto the target: -0.1 + 1 + 10
    assert terminated and reward_text(env, reward, info) == str(-0.1 + (-0.1 + 1.0 + 10.0)) == "10.8"
    lake = envs.make("frozen_lake", fixed_map=("SFF", "FFF", "FFG"), success_rate=1.0)
    lake.reset(seed=0)
    _, reward, _, _, info = lake.step("<think>t</think><answer>Right</answer>")
    assert reward_text(lake, reward, info) == "0.0"  # gymnasium's float reward, as RAGEN-2 prints it
    _, reward, _, _, info = lake.step("<think>t</think><answer>Right || Down</answer>")
    assert reward_text(lake, reward, info) == "0.0"
    _, reward, _, _, info = lake.step("<think>t</think><answer>Down</answer>")
    assert info["success"] and reward_text(lake, reward, info) == "1.0"


def test_reward_feedback_with_penalty_shows_the_trained_reward():
    env = _sokoban(ROOM, reward_feedback="with_penalty")
    _, reward, _, _, info = env.step("<think>t</think><answer>Down || Jump</answer>")
    assert reward_text(env, reward, info) == "-0.2"
    feedback, state = after_turn(env, 2, env.render(), reward, info)
    assert feedback == "Reward:\n-0.2\n" and state.startswith("\nTurn 2:\nState:\n")
    with pytest.raises(envs.EnvConfigError, match="reward_feedback"):
        envs.make("sokoban", reward_feedback="shown")


def test_after_turn_warns_after_a_turn_with_nothing_valid():
    env = _sokoban(ROOM)
    _, reward, _, _, info = env.step("<think>t</think><answer>Jump</answer>")
    feedback, state = after_turn(env, 2, env.render(), reward, info, max_response_words=100)
    assert feedback == "Reward:\n0\n"
    assert state == turn_message(env, 2, env.render(), max_response_words=100, previous_turn_invalid=True)["content"]


# RAGEN-2's system prompts, written out from config/envs.yaml (YAML `|` blocks keep the spaces at
# line ends and a final newline) + ctx_manager's symbol and action lines from the default config.
RAGEN_SOKOBAN_SYSTEM = (
    "You're a helpful assistant. You are solving the Sokoban puzzle. \n"
    "You are the player and you need to push all boxes to targets. \n"
    "When you are right next to a box, you can push it by moving in the same direction. \n"
    "You cannot push a box through a wall, and you cannot pull a box. \n"
    "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>\n"
    "\nThe meaning of each symbol in the state is:\n"
    "#: wall, _: empty, O: target, √: box on target, X: box, P: player, S: player on target"
    "\nYour available actions are:\nUp, Down, Left, Right"
    '\nYou can make up to 10 actions, separated by the action separator " || "\n')
RAGEN_FROZEN_LAKE_SYSTEM = (
    "You're a helpful assistant. You are solving the FrozenLake puzzle. Forbid the whole and go to the target. "
    "You may move to the unintended direction due to the slippery ice. Example answer format: <think>To forbid "
    "the hole and go to the target, I should go left then go up.</think><answer>Left || Up</answer>"
    "\nThe meaning of each symbol in the state is:\n"
    "P: player, _: empty, O: hole, G: goal, X: player in hole, √: player on goal"
    "\nYour available actions are:\nLeft, Down, Right, Up"
    '\nYou can make up to 10 actions, separated by the action separator " || "\n')


@pytest.mark.parametrize("name", ["sokoban", "larger_sokoban", "sokoban_different_grid_vocab"])
def test_default_instruction_is_ragen2s_text_verbatim(name):
    # every Sokoban variant gets the default symbol list in RAGEN-2 (ctx_manager reads the default config)
    env = envs.make(name)
    env.reset(seed=0)
    assert system_message(env)["content"] == RAGEN_SOKOBAN_SYSTEM


def test_default_instruction_of_the_other_envs_is_ragen2s():
    lake = envs.make("frozen_lake")
    lake.reset(seed=0)
    assert system_message(lake)["content"] == RAGEN_FROZEN_LAKE_SYSTEM
    assert system_message(envs.make("metamathqa"))["content"] == "You're a helpful assistant. You are solving Math problems. "
    countdown = system_message(envs.make("countdown"))["content"]
    assert countdown.startswith("You're a helpful assistant. You are solving the Countdown puzzle. You should use the "
                                "num list to create an equation that equals the target. Example answer format: <think> "
                                "To find an equation using [3, 5, 2] to get 4.")
    assert countdown.endswith("So the answer is 2 + 5 - 3 = 4. </think><answer>2 + 5 - 3</answer>")
    coord = system_message(envs.make("sokoban_coord"))["content"]
    assert "to the bottom-right corner (5, 5). \n" in coord and coord.endswith(RAGEN_SOKOBAN_SYSTEM[-220:])
    search = system_message(envs.make("searchqa"))["content"]
    assert search.startswith("You're a helpful assistant. You are a search agent answering questions by searching")
    assert search.endswith("<answer>finish[Henry Platt]</answer>\n")


def test_bandit_states_the_game_in_its_first_observation_as_ragen2():
    env = envs.make("bandit")
    obs, _ = env.reset(seed=0)
    first, second = env.action_vocabulary
    assert system_message(env)["content"] == "You're a helpful assistant. "  # no instruction, no action list
    assert obs == (
        "You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to pull. \n"
        "Game Rules: \n"
        f"1. There are 2 arms, named {first} and {second}\n"
        "2. Each arm has its own reward distribution, related to their names. \n"
        "3. Analyze the symbolic meaning of each arm's name to guess how their reward distribution might behave.\n"
        "4. Based on the symbolic meaning of their names, which arm do you think is more likely to give higher "
        f"rewards on average? Choose between {first} and {second}, and output like <answer> {first} </answer> or "
        f"<answer> {second} </answer>.\n")


def test_explicit_instruction_style_keeps_ours():
    env = envs.make("sokoban_different_grid_vocab", instruction_style="explicit")
    env.reset(seed=0)
    content = system_message(env)["content"]
    assert content.startswith("You're a helpful assistant. " + env.instruction.strip())
    assert "W: wall" in content and "#: wall" not in content  # the symbols actually drawn
    bandit = envs.make("bandit", instruction_style="explicit")
    obs, _ = bandit.reset(seed=0)
    assert "Your available actions are:\n" in system_message(bandit)["content"] and "Game Rules" not in obs
    with pytest.raises(envs.EnvConfigError, match="instruction_style"):
        envs.make("sokoban", instruction_style="paper")


@pytest.mark.parametrize("name, words", [("sokoban", 100), ("sokoban_coord", 120), ("frozen_lake_coord", 120),
                                         ("bandit", 100), ("webshop", 200), ("searchqa", 300)])
def test_every_turn_ends_with_ragen2s_length_line_for_the_env(name, words):
    # envs.yaml max_tokens; ctx_manager: f"Max response length: {max_tokens} words (tokens)."
    env = envs.make(name)
    obs, _ = env.reset(seed=0)
    assert turn_message(env, 1, obs)["content"].endswith(
        f"Strictly follow this format. Max response length: {words} words (tokens).\n")
    assert turn_message(env, 1, obs, max_response_words=7)["content"].endswith("Max response length: 7 words (tokens).\n")
    explicit = envs.make(name, instruction_style="explicit")
    obs, _ = explicit.reset(seed=0)
    assert "Max response length" not in turn_message(explicit, 1, obs)["content"]
