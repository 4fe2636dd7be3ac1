"""RAGEN-2's prompt text, verbatim, for `instruction_style="ragen"` (the default).

From mll-lab-nu/RAGEN@20daedc: each env's `env_instruction` in config/envs.yaml (as YAML loads
it: a `|` block keeps its trailing newline and the spaces at line ends), the symbol list and
action list that ragen/llm_agent/ctx_manager.py appends from the env's *default* config, and
the Bandit's first observation (ragen/env/bandit/env.py). Prompt text, not code: reproducing
RAGEN-2's numbers needs the model to read the same words.
"""

from __future__ import annotations

# ctx_manager: "\nThe meaning of each symbol in the state is:\n" + ", ".join(f"{k}: {v}") over the
# default config's grid_vocab, whatever the variant draws (its env_config is not consulted).
VOCAB_HEADER = "\nThe meaning of each symbol in the state is:\n"
SOKOBAN_VOCAB = VOCAB_HEADER + "#: wall, _: empty, O: target, √: box on target, X: box, P: player, S: player on target"
FROZEN_LAKE_VOCAB = VOCAB_HEADER + "P: player, _: empty, O: hole, G: goal, X: player in hole, √: player on goal"
# envs.yaml max_tokens, in the "Max response length: N words (tokens)." ending every turn message.
MAX_TOKENS = 100  # Sokoban, LargerSokoban, SokobanDifferentGridVocab, FrozenLake, Bandit, Countdown, MetamathQA
COORD_MAX_TOKENS = 120  # CoordSokoban, CoordFrozenLake
WEBSHOP_MAX_TOKENS = 200
SEARCHQA_MAX_TOKENS = 300
DEEPCODER_MAX_TOKENS = 8000
# The default configs' action_lookup, in its order (Bandit's is None: no action list).
SOKOBAN_ACTIONS = ("Up", "Down", "Left", "Right")
FROZEN_LAKE_ACTIONS = ("Left", "Down", "Right", "Up")


# config/envs.yaml env_instruction; SimpleSokoban, LargerSokoban and SokobanDifferentGridVocab share one,
# Bandit and BanditTest have none.
SOKOBAN = (
    'You are solving the Sokoban puzzle. \n'
    'You are the player and you need to push all boxes to targets. \n'
    'When you are right next to a box, you can push it by moving in the same direction. \n'
    'You cannot push a box through a wall, and you cannot pull a box. \n'
    'The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>\n'
)
COORD_SOKOBAN = (
    'You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets.\n'
    'You are provided with a symbol grid and the zero-indexed coordinates of the player, each '
    'box, and each target. \n'
    'Coordinates range from the top-left corner (0, 0) to the bottom-right corner (5, 5). \n'
    'When you are exactly next to a box, you can push it by moving in the same direction. \n'
    'You cannot push a box through a wall, and you cannot pull a box.\n'
    'The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>.\n'
)
FROZEN_LAKE = (
    'You are solving the FrozenLake puzzle. Forbid the whole and go to the target. You may '
    'move to the unintended direction due to the slippery ice. Example answer format: '
    '<think>To forbid the hole and go to the target, I should go left then go '
    'up.</think><answer>Left || Up</answer>'
)
COORD_FROZEN_LAKE = (
    'You are solving the FrozenLake puzzle. The observation includes both a symbol grid and '
    'zero-indexed coordinates for the start, goal, player, and any holes.\n'
    'Coordinates range from the top-left corner (0, 0) to the bottom-right corner (5, 5).\n'
    'Beware that the ice is slippery, so the agent might slide and end up in an unintended tile.\n'
    'Respond with a sequence of actions such as <answer>Left || Up || Up</answer>.\n'
)
COUNTDOWN = (
    'You are solving the Countdown puzzle. You should use the num list to create an equation '
    'that equals the target. Example answer format: <think> To find an equation using [3, 5, '
    "2] to get 4. Let's check 2 + 5 = 7, 7 - 3 = 4. So the answer is 2 + 5 - 3 = 4. "
    '</think><answer>2 + 5 - 3</answer>'
)
BANDIT = ''
METAMATHQA = 'You are solving Math problems. '
WEBSHOP = (
    'You are browsing an online shop. Based on the instruction, buy a product that close to '
    'the production description. You need to search, read the search results, pick a product, '
    'choose the size and color and buy. You should only choose action from the available '
    'actions list provided later.  Example process: I need a gingko light and 20x20 pillow '
    'cover that is hand painted. First search[gingko light 20x20 pillow cover hand painted], '
    'answer format: <answer>search[blanket with fleece throw]</answer>. Valid answer is '
    'search[<keywords>] or click[<clickable>].'
)
SEARCHQA = (
    'You are a search agent answering questions by searching for information.\n'
    'Use search[your query] to find relevant documents, and finish[your answer] to submit your '
    'final answer.\n'
    '\n'
    'You should first reason step-by-step about the current situation. This reasoning process '
    'MUST be enclosed within <think> </think> tags.\n'
    'Then provide your action within <answer>...</answer> tags.\n'
    '\n'
    'Examples:\n'
    "  <think>I need to find information about Ben Platt's father.</think><answer>search[Ben "
    'Platt father parent]</answer>\n'
    "  <think>Based on the search results, Ben Platt's father is Henry "
    'Platt.</think><answer>finish[Henry Platt]</answer>\n'
)
DEEPCODER = (
    'You are solving a coding task. Provide a complete Python function solution only. Format: '
    '<answer>...</answer>'
)

# ragen/env/bandit/env.py INIT_PROMPT: the first observation, .format(name_a=, name_b=)
BANDIT_OBSERVATION = (
    'You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to pull. \n'
    'Game Rules: \n'
    '1. There are 2 arms, named {name_a} and {name_b}\n'
    '2. Each arm has its own reward distribution, related to their names. \n'
    "3. Analyze the symbolic meaning of each arm's name to guess how their reward distribution "
    'might behave.\n'
    '4. Based on the symbolic meaning of their names, which arm do you think is more likely to '
    'give higher rewards on average? Choose between {name_a} and {name_b}, and output like '
    '<answer> {name_a} </answer> or <answer> {name_b} </answer>.\n'
)
