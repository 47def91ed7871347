"""tokencredit_trl/rewards.py: verifiers of final answers, as TRL's reward functions.

A reward function takes TRL's keyword arguments (prompts, completions, completion_ids, and each
dataset column by its name) and returns one float per completion. Each here is a verifier: 1.0
for an answer checked right, 0.0 otherwise, so dynamic sampling can filter on its verdicts.

    final_answer    the completion's final number equals the `answer` column's (math datasets)
    tiny_verifier   tiny_task.verify: the tiny task's exact check, on the `terms` column
"""

import re
from typing import List, Optional

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")  # 1,234.5 and -3: commas separate thousands


def final_number(text: str) -> Optional[float]:
    """The number a text answers with: the first after its last '####' (GSM8K's marker), else the
    first inside its last \\boxed{...}, else its last number. None if there is none."""
    if "####" in text:
        found = NUMBER.findall(text.rsplit("####", 1)[1])[:1]
    elif "\\boxed{" in text:
        found = NUMBER.findall(text.rsplit("\\boxed{", 1)[1].split("}", 1)[0])[:1]
    else:
        found = NUMBER.findall(text)[-1:]
    return float(found[0].replace(",", "")) if found else None


def final_answer(completions: list, answer: list, **kwargs) -> List[float]:
    """1.0 where a completion's final_number equals that of its row's `answer` (a number, or a
    text ending in one, as GSM8K's '... #### 72'), else 0.0. Completions may be chat messages."""
    rewards = []
    for completion, reference in zip(completions, answer):
        expected = final_number(str(reference))
        if expected is None:
            raise ValueError(f"final_answer: the answer column must hold a number, got "
                             f"{reference!r}")
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        rewards.append(float(final_number(text) == expected))
    return rewards


def tiny_verifier(completions: list, completion_ids: list, terms: list, **kwargs) -> List[float]:
    """tiny_task.verify as a reward function: 1.0 for a completion that ended with <eos> (TRL
    keeps it in completion_ids; the id is that of tiny_task's tokenizer) and whose single '>' is
    followed by the sum of its row's `terms`, else 0.0."""
    import tiny_task
    eos = tiny_task.build_tokenizer().eos_token_id
    return [float(tiny_task.verify(t, text, len(ids) > 0 and ids[-1] == eos))
            for text, ids, t in zip(completions, completion_ids, terms)]
