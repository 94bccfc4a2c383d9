"""Generate TextWorld games locally and keep them in a disk cache shared by processes.

Games are made in this process through TextWorld's Python API (what ``tw-make`` does),
deterministic per seed, into ``<cache_dir>/<challenge>-seed<seed>-<key>/``; a per-game ``flock``
and a rename into place mean no process ever sees a half-written game.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO

from agent_memory.envs.base import stable_hash
from agent_memory.envs.textworld_games.settings import normalize_settings

INSTALL_HINT: Final = 'pip install "agent-memory[textworld]"'
# Jericho (TextWorld's Z-machine interpreter) switches on its TextWorld support (no status line in
# the text, victory detection) only for story files whose name starts with "tw-".
GAME_FILE: Final = "tw-game.z8"
GAME_JSON: Final = "tw-game.json"
META_FILE: Final = "meta.json"

# TextWorld's generator keeps global state (its ``g_rng``, cached knowledge bases): one game at a
# time per process.
_GENERATION_LOCK = threading.Lock()


def require_textworld() -> None:
    """Raise a clear ImportError when the optional ``textworld`` package is not installed."""
    if importlib.util.find_spec("textworld") is None:
        raise ImportError(
            "the TextWorld environment needs the optional 'textworld' package (TextWorld 1.7);"
            f" install it with: {INSTALL_HINT}"
        )


@contextlib.contextmanager
def quiet_jericho() -> Iterator[None]:
    """Hide Jericho's UnsupportedGameWarning, noise for TextWorld's own games (TextWorld computes
    the admissible commands), which test runners and ``-W`` would show again after TextWorld
    silenced it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module=r"jericho\b")
        yield


def textworld_version() -> str:
    """The installed TextWorld version (part of every cache key: a new generator, new games)."""
    require_textworld()
    return importlib.metadata.version("textworld")


def default_cache_dir() -> Path:
    """Where games are cached unless ``cache_dir`` is given.

    ``$AGENT_MEMORY_CACHE/textworld`` if that variable is set, else
    ``$XDG_CACHE_HOME/agent_memory/textworld``, else ``~/.cache/agent_memory/textworld``.
    """
    root = os.environ.get("AGENT_MEMORY_CACHE")
    if root:
        return Path(root).expanduser() / "textworld"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "agent_memory" / "textworld"


@dataclass(frozen=True)
class GameSpec:
    """What identifies one generated game: challenge, complete settings, seed, TextWorld version."""

    challenge: str
    settings: Mapping[str, Any]
    seed: int
    version: str

    @property
    def key(self) -> str:
        """Stable hash of the spec (equal across processes and runs)."""
        items = tuple(sorted(self.settings.items()))
        return stable_hash("textworld-game", self.challenge, items, self.seed, self.version)

    @property
    def dirname(self) -> str:
        """The game's directory name inside the cache (readable prefix + key)."""
        return f"{self.challenge}-seed{self.seed}-{self.key}"


@dataclass(frozen=True)
class CachedGame:
    """A game on disk, ready to play with ``textworld.start(str(path))``."""

    path: Path
    key: str
    meta: Mapping[str, Any]
    generated: bool  # True when this call generated it (False: found in the cache)


def make_spec(challenge: str, settings: Mapping[str, Any] | None, seed: int) -> GameSpec:
    """Check the inputs and build the :class:`GameSpec` of one game."""
    normalized = normalize_settings(challenge, settings)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"game seed must be an int in [0, 2**32), got {seed!r}")
    return GameSpec(challenge, normalized, seed, textworld_version())


def _read_valid(directory: Path, key: str) -> dict[str, Any] | None:
    """The directory's metadata if it holds a complete game with this key, else None."""
    try:
        meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    complete = all((directory / name).is_file() for name in (GAME_FILE, GAME_JSON))
    return meta if complete and isinstance(meta, dict) and meta.get("key") == key else None


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock held for the block (released by the OS if the process dies)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _generate_into(spec: GameSpec, directory: Path) -> dict[str, Any]:
    """Generate and compile the game into ``directory`` and write its metadata last."""
    import textworld
    import textworld.challenges
    from textworld.generator import compile_game

    start = time.perf_counter()
    options = textworld.GameOptions()
    options.seeds = spec.seed
    options.path = str(directory / GAME_FILE)
    options.file_ext = ".z8"
    options.force_recompile = True
    _, make, _ = textworld.challenges.CHALLENGES[spec.challenge]
    with _GENERATION_LOCK, quiet_jericho():  # TextWorld tests walkthroughs with Jericho
        try:
            game = make(dict(spec.settings), options)
            compile_game(game, options)
        except Exception as exc:
            raise RuntimeError(
                f"TextWorld could not generate {spec.challenge} with settings"
                f" {dict(spec.settings)} and seed {spec.seed}: {type(exc).__name__}: {exc}"
            ) from exc
    # The Inform 7 source is not needed to play.
    (directory / GAME_FILE).with_suffix(".ni").unlink(missing_ok=True)
    meta = {
        "key": spec.key,
        "challenge": spec.challenge,
        "settings": dict(spec.settings),
        "seed": spec.seed,
        "textworld_version": spec.version,
        "uuid": game.metadata.get("uuid"),
        "objective": game.objective,
        "max_score": game.max_score,
        "walkthrough": list(game.metadata.get("walkthrough") or []),
        "generation_seconds": round(time.perf_counter() - start, 3),
    }
    (directory / META_FILE).write_text(json.dumps(meta, indent=1), encoding="utf-8")
    return meta


def ensure_game(
    challenge: str,
    settings: Mapping[str, Any] | None = None,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
) -> CachedGame:
    """Return the cached game, generating it first if it is not in the cache (process-safe).

    Args:
        challenge: One of :data:`~agent_memory.envs.textworld_games.settings.CHALLENGES`.
        settings: The challenge's settings (see ``DEFAULT_SETTINGS``); missing keys take defaults.
        seed: TextWorld's game seed (``tw-make --seed``).
        cache_dir: Cache root; default :func:`default_cache_dir`.

    Raises:
        ValueError: Bad challenge, settings or seed.
        ImportError: ``textworld`` is not installed.
        RuntimeError: TextWorld failed to generate or compile the game.
    """
    spec = make_spec(challenge, settings, seed)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    final = root / spec.dirname
    meta = _read_valid(final, spec.key)
    if meta is not None:
        return CachedGame(final / GAME_FILE, spec.key, meta, generated=False)
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{spec.dirname}.lock"):
        meta = _read_valid(final, spec.key)  # another process may have made it while we waited
        if meta is not None:
            return CachedGame(final / GAME_FILE, spec.key, meta, generated=False)
        if final.exists():  # incomplete (e.g. files removed by hand): regenerate it
            shutil.rmtree(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{spec.dirname}-", dir=root))
        try:
            meta = _generate_into(spec, tmp)
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is readable like any dir
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return CachedGame(final / GAME_FILE, spec.key, meta, generated=True)


@dataclass(frozen=True)
class GenerationEvent:
    """What :func:`ensure_games` reports: game ``index`` (of ``total``) is about to be made
    (``game`` None), or is ready (``game`` set: ``game.generated`` False when it came from the
    cache)."""

    index: int
    total: int
    challenge: str
    seed: int
    game: CachedGame | None = None


#: A progress callback: called before and after every game of :func:`ensure_games`.
ProgressCallback = Callable[[GenerationEvent], None]


class GenerationBar:
    """A tqdm bar for :func:`ensure_games`, naming the game being generated; :meth:`close` it.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> bar = GenerationBar(2, "tw-simple", file=out)
        >>> bar(GenerationEvent(0, 2, "tw-simple", seed=7))
        >>> "0/2" in out.getvalue() and "generating seed 7" in out.getvalue()
        True
        >>> bar.close()
    """

    def __init__(self, total: int, challenge: str, file: TextIO | None = None) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=total,
            desc=f"TextWorld {challenge} games",
            unit="game",
            file=file,
            mininterval=0,
            dynamic_ncols=True,
        )

    def __call__(self, event: GenerationEvent) -> None:
        if event.game is None:
            self.bar.set_postfix_str(f"generating seed {event.seed}", refresh=True)
            return
        seconds = event.game.meta.get("generation_seconds")
        how = f"made in {seconds} s" if event.game.generated else "found in the cache"
        self.bar.set_postfix_str(f"seed {event.seed} {how}", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        """End the bar (its last line stays on screen)."""
        self.bar.close()


def ensure_games(
    challenge: str,
    settings: Mapping[str, Any] | None = None,
    seeds: Iterable[int] = (0,),
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool | ProgressCallback = False,
) -> list[CachedGame]:
    """:func:`ensure_game` for every seed, in order (every spec checked first), with progress.

    Args:
        challenge, settings, cache_dir: As in :func:`ensure_game`.
        seeds: TextWorld game seeds, one game each.
        progress: True for a :class:`GenerationBar` on stderr (unless every game is cached), or
            a callback given a :class:`GenerationEvent` before and after each game.

    Example:
        >>> import pytest, tempfile
        >>> _ = pytest.importorskip("textworld")
        >>> cache, events = tempfile.TemporaryDirectory(), []
        >>> games = ensure_games("tw-treasure_hunter", None, [3, 4], cache.name, events.append)
        >>> [(e.index, e.seed, e.game is not None) for e in events]
        [(0, 3, False), (0, 3, True), (1, 4, False), (1, 4, True)]
        >>> [g.generated for g in games], [g.meta["seed"] for g in games]
        ([True, True], [3, 4])
        >>> cache.cleanup()
    """
    seeds = list(seeds)
    specs = [make_spec(challenge, settings, seed) for seed in seeds]  # refuse bad input first
    callback: ProgressCallback | None = None
    bar: GenerationBar | None = None
    if progress is True:
        root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        if any(_read_valid(root / spec.dirname, spec.key) is None for spec in specs):
            bar = callback = GenerationBar(len(seeds), challenge)
    elif callable(progress):
        callback = progress
    elif progress is not False:
        raise TypeError(f"progress must be a bool or a callable, got {progress!r}")
    games = []
    try:
        for index, seed in enumerate(seeds):
            if callback is not None:
                callback(GenerationEvent(index, len(seeds), challenge, seed))
            game = ensure_game(challenge, settings, seed, cache_dir=cache_dir)
            games.append(game)
            if callback is not None:
                callback(GenerationEvent(index, len(seeds), challenge, seed, game))
    finally:
        if bar is not None:
            bar.close()
    return games
