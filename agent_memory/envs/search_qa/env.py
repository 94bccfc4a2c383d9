"""The Search-QA Gymnasium env: Search-R1 style search-and-answer over a generated corpus."""

from __future__ import annotations

from typing import Any, Final, Literal

from agent_memory.envs.base import (
    STATE_KEY,
    TASK,
    WON,
    TextEnv,
    check_int,
    is_int,
    sanitize,
    stable_hash,
    step_info,
    text_space,
)
from agent_memory.envs.search_qa.corpus import Corpus, Question, get_corpus
from agent_memory.envs.search_qa.parsing import (
    MAX_ACTION_CHARS,
    exact_match,
    normalize_answer,
    parse_action,
)
from agent_memory.envs.search_qa.retrieval import BM25Index, format_information, get_index

#: Smallest ``max_obs_chars``: the reset observation (instructions + question) must fit.
MIN_OBS_CHARS: Final = 1024

INSTRUCTIONS: Final = (
    "Answer the question by searching a document collection. Reply with exactly one action:\n"
    "- <search> your query </search> to search; the top {top_k} passages come back between "
    "<information> and </information>.\n"
    "- <answer> your answer </answer> to give the final answer, short and without explanation "
    "(for example <answer>Beijing</answer>); this ends the episode.\n"
    "Question: {question}"
)
INVALID_HELP: Final = (
    "Invalid action: {reason}. To search, put the query between <search> and </search>. "
    "To give the final answer, put it between <answer> and </answer>. Use exactly one of the two."
)


class SearchQAEnv(TextEnv):
    """Search-R1 style question answering over a generated corpus of fictitious entities.

    ``<search>query</search>`` returns the top-``top_k`` BM25 passages in Search-R1's format;
    ``<answer>text</answer>`` ends the episode, with reward 1.0 and ``won`` iff the SQuAD-normalised
    answer is right; anything else is invalid. ``info`` adds ``question_id``, ``hops`` and
    ``retrieved_doc_ids``, and has no ``admissible_actions``.

    Args:
        top_k: passages returned per search, in ``[1, number of passages]``.
        split: question subset: ``"train"``, ``"test"`` (every 5th question) or ``"all"``.
        num_questions: keep only the first ``num_questions`` of the split (``None``: all).
        corpus_seed: seed of the generated corpus (``>= 0``).
        max_obs_chars: observation length limit (passages are cut to fit, tags kept).

    Example:
        >>> env = SearchQAEnv()
        >>> obs, info = env.reset(seed=0, options={"question_index": 0})
        >>> info["task"]
        'In what year was the company that Therex Flivoudax works for founded?'
        >>> env.oracle_action()
        '<search>Therex Flivoudax</search>'
        >>> obs, reward, terminated, truncated, info = env.step(env.oracle_action())
        >>> print(obs.splitlines()[0][:60])
        <information>Doc 1(Title: Therex Flivoudax) Therex Flivoudax
        >>> obs, reward, terminated, truncated, info = env.step("<search>Thouluk Motors</search>")
        >>> env.oracle_action()
        '<answer>1967</answer>'
        >>> env.step("<answer>the 1967.</answer>")[1:3]
        (1.0, True)
        >>> env.step("ok")[4]["invalid_reason"]
        'the episode is over; call reset()'
    """

    def __init__(
        self,
        top_k: int = 3,
        split: Literal["train", "test", "all"] = "all",
        num_questions: int | None = None,
        corpus_seed: int = 0,
        max_obs_chars: int = 4096,
        render_mode: Literal["ansi"] | None = None,
    ) -> None:
        super().__init__(render_mode)
        if split not in ("train", "test", "all"):
            raise ValueError(f"split must be one of 'train', 'test', 'all', got {split!r}")
        check_int("max_obs_chars", max_obs_chars, MIN_OBS_CHARS)
        self.corpus: Corpus = get_corpus(corpus_seed)  # validates corpus_seed
        n_docs = len(self.corpus.documents)
        if not is_int(top_k) or not 1 <= top_k <= n_docs:
            raise ValueError(f"top_k must be an int in [1, {n_docs}], got {top_k!r}")
        pool = [q for q in self.corpus.questions if split in ("all", q.split)]
        if num_questions is not None and (
            not is_int(num_questions) or not 1 <= num_questions <= len(pool)
        ):
            raise ValueError(
                f"num_questions must be None or an int in [1, {len(pool)}] (the {split!r} split "
                f"has {len(pool)} questions), got {num_questions!r}"
            )
        self.questions: tuple[Question, ...] = tuple(pool[:num_questions])
        self.index: BM25Index = get_index(self.corpus)  # shared by every env in the process
        self.top_k = top_k
        self.split = split
        self.max_obs_chars = max_obs_chars
        self.observation_space = text_space(max_obs_chars)
        self.action_space = text_space(MAX_ACTION_CHARS)
        self._question: Question | None = None
        self._retrieved: set[str] = set()
        self._queries: list[str] = []  # normalised queries issued (the oracle follows its hops)
        self._done = False

    # --- Gymnasium API -------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode on a question: ``options["question_index"]``, else drawn by the RNG."""
        super().reset(seed=seed)
        index = (options or {}).get("question_index")
        if index is None:
            index = int(self.np_random.integers(len(self.questions)))
        elif not is_int(index) or not 0 <= index < len(self.questions):
            raise ValueError(
                f"options['question_index'] must be an int in [0, {len(self.questions) - 1}], "
                f"got {index!r}"
            )
        self._question = self.questions[int(index)]
        self._retrieved = set()
        self._queries = []
        self._done = False
        obs = INSTRUCTIONS.format(top_k=self.top_k, question=self._question.text)
        self._last_obs = sanitize(obs, self.max_obs_chars)
        return self._last_obs, self._info(won=False, retrieved=[])

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Search, answer, or (for anything else) report an invalid action; never raises."""
        if self._question is None:
            raise RuntimeError("SearchQAEnv.step() called before reset()")
        if self._done:
            return self._invalid("the episode is over; call reset()", terminated=True)
        parsed = parse_action(action)
        if parsed.kind == "invalid":
            return self._invalid(parsed.reason)
        if parsed.kind == "search":
            hits = self.index.search(parsed.content, self.top_k)
            doc_ids = [h.document.doc_id for h in hits]
            self._retrieved.update(doc_ids)
            self._queries.append(normalize_answer(parsed.content))
            obs = format_information([h.document for h in hits], max_chars=self.max_obs_chars)
            self._last_obs = sanitize(obs, self.max_obs_chars)
            info = step_info(self._info(won=False, retrieved=doc_ids))
            return self._last_obs, 0.0, False, False, info
        won = exact_match(parsed.content, self._question.answer)
        self._done = True
        verdict = "correct" if won else "incorrect"
        self._last_obs = sanitize(
            f"Your answer: {parsed.content}\nThe answer is {verdict}.", self.max_obs_chars
        )
        info = step_info(self._info(won=won, retrieved=[]))
        return self._last_obs, float(won), True, False, info

    # --- Expert and helpers --------------------------------------------------------------

    def oracle_action(self) -> str:
        """The expert's next action: search each hop's entity in order, then answer.

        It follows the question's reasoning chain, so a 2-hop question takes two searches.
        """
        if self._question is None:
            raise RuntimeError("SearchQAEnv.oracle_action() called before reset()")
        for hop in self._question.hops:
            if normalize_answer(hop.entity) not in self._queries:
                return f"<search>{hop.entity}</search>"
        return f"<answer>{self._question.answer}</answer>"

    @property
    def question(self) -> Question | None:
        """The current episode's question (with its gold answer and hops), or ``None``."""
        return self._question

    @property
    def retrieved_doc_ids(self) -> frozenset[str]:
        """Ids of every passage retrieved so far in this episode."""
        return frozenset(self._retrieved)

    def _state_key(self) -> str:
        assert self._question is not None
        return stable_hash(
            "search_qa", self.corpus.corpus_id, self._question.qid, tuple(sorted(self._retrieved))
        )

    def _info(self, *, won: bool, retrieved: list[str]) -> dict[str, Any]:
        assert self._question is not None
        return {
            TASK: self._question.text,
            WON: won,
            STATE_KEY: self._state_key(),
            "question_id": self._question.qid,
            "hops": len(self._question.hops),
            "retrieved_doc_ids": retrieved,
        }

    def _invalid(
        self, reason: str, *, terminated: bool = False
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._last_obs = sanitize(INVALID_HELP.format(reason=reason), self.max_obs_chars)
        info = step_info(self._info(won=False, retrieved=[]), reason)
        return self._last_obs, 0.0, terminated, False, info
