"""A source's sentence made fit to quote: no label prefix ("Our summary:"), no page title glued to its
start, no cut snippet, and said whose it is when it has no subject of its own or speaks in the
first person ("Malkov and Yashunin (2018) build…", "Your note says: …").

Pure text work, the same for every writer and for chat: the writer quotes, this only decides what
is quoted and how it is attributed.
"""

from __future__ import annotations

import re

from fedresearch.core.models import FusedResult
from fedresearch.core.text import cjk_bigrams

# "Our summary:", "Summary -", "TL;DR:", "Abstract:", "Highlight:", "Note:", "Background:" ...
_LABEL_PREFIX = re.compile(
    r"^\s*(?:(?:our|my|the|a|author'?s?|editor'?s?)\s+)?"
    r"(?:summary|abstract|tl;?\s?dr|note|notes|highlight|comment|background|conclusions?|results?|methods?|"
    r"objectives?|purpose|aims?|key\s+(?:points?|findings?)|takeaways?|excerpt|snippet|description)"
    r"\s*(?:[:：]|\s[-–—]\s)\s*",
    re.IGNORECASE,
)
_CUT = re.compile(r"(?:…|\.\.\.|\u2026)\s*$")
_REPEATED_STOP = re.compile(r"([.!?])\1+(?=\s|$)")
_GLUED_STOP = re.compile(r"\.\.(?=[A-Z])")  # "in retrieval..A scheme is outlined"
_FIRST_PERSON = re.compile(r"(?:^|\s)(?:I|I'm|I've|I'd|my|My|me|mine)(?=[\s,.;:!?]|$)")
# a determiner or pronoun that follows a verb with no subject before it: "Builds a graph", "Uses the"
_OBJECT_START = {
    "a", "an", "the", "each", "every", "both", "its", "their", "this", "these", "those", "all", "some",
    "two", "three", "several", "many", "most", "no", "one", "it", "them", "that", "how", "what", "whether",
}  # fmt: skip
_NOT_VERBS = {"this", "thus", "its", "has", "was", "is", "as", "us", "his", "yes", "less", "plus", "news", "always"}
_USERS_OWN = {"highlight", "file", "note"}
# verbs an abstract's sentence opens with when it leaves out its subject (the paper)
_OPENING_VERBS = {
    "introduces", "proposes", "presents", "treats", "describes", "shows", "compares", "represents", "builds",
    "uses", "evaluates", "studies", "explores", "argues", "examines", "reports", "develops", "extends", "defines",
    "applies", "combines", "learns", "trains", "measures", "analyzes", "analyses", "surveys", "reviews",
    "discusses", "demonstrates", "investigates", "provides", "offers", "suggests", "encodes", "outlines",
}  # fmt: skip
# what follows such a word when it is a noun after all ("Surveys of users show…", "Reviews are…")
_NOT_OBJECTS = {"of", "are", "were", "is", "was", "can", "may", "have", "had", "and", "or", "from", "in", "on", "by"}


def tidy(sentence: str, title: str = "") -> str:
    """`sentence` without a label before it, its page's title glued to its start, or doubled stops."""
    text = _LABEL_PREFIX.sub("", sentence, count=1)
    heading = " ".join(title.split())
    while heading and len(text) > len(heading) + 20 and text.lower().startswith(heading.lower()):
        rest = text[len(heading) :].lstrip(" :.-–—|")
        if not (rest[:1].isupper() or cjk_bigrams(rest[:1])):
            break
        text = rest  # the title, perhaps twice (a page's heading line and its first line run together)
    text = _REPEATED_STOP.sub(r"\1", _GLUED_STOP.sub(". ", text))
    return text[:1].upper() + text[1:] if text[:1].islower() else text


def is_cut(sentence: str) -> bool:
    """A snippet cut off mid-sentence ("…needs no score norm…")."""
    return bool(_CUT.search(sentence))


# how a note's line that is no statement begins: "Worth measuring on MED first.", "Maybe not."
_FRAGMENT_OPENERS = frozenset({
    "worth", "probably", "maybe", "perhaps", "possibly", "todo", "check", "try",
    "remember", "need", "needs", "should", "must", "could", "might",
})  # fmt: skip


def note_fragment(sentence: str) -> bool:
    """A line of a note that says no finding by itself ("Worth measuring on MED and CISI first.")."""
    first = sentence.split(maxsplit=1)[0].strip(",:;").lower() if sentence.split() else ""
    return first in _FRAGMENT_OPENERS


def first_person(sentence: str) -> bool:
    return bool(_FIRST_PERSON.search(sentence))


def subjectless(sentence: str) -> bool:
    """A sentence that starts with its verb: "Builds a layered graph…", "Represents documents and…"."""
    words = sentence.split()
    if len(words) < 3 or not words[0][:1].isupper():
        return False
    if not words[0].isalpha():  # "Titles, abstracts and…": a list of nouns, not a verb
        return False
    verb, following = words[0].lower(), words[1].lower().strip(",;:")
    if verb in _OPENING_VERBS and following not in _NOT_OBJECTS:
        return True  # "Introduces RankNet, which…", "Treats metasearch as an election"
    if verb in _NOT_VERBS or not verb.isalpha() or not verb.endswith("s") or verb.endswith(("ss", "us", "is")):
        return False
    return following in _OBJECT_START or (following.endswith("s") and following.isalpha() and len(following) > 3)


# where a sentence's main clause ends: a relative clause or a pause ("A survey … that explains …")
_MAIN_CLAUSE_END = re.compile(r",|;|:| [–—-] | (?:that|which|who|whose|where|when|to)\b")
_AUXILIARIES = {
    "is", "are", "was", "were", "be", "been", "being", "has", "have", "had", "do", "does", "did", "can",
    "could", "may", "might", "must", "shall", "should", "will", "would",
}  # fmt: skip


def verbless(sentence: str) -> bool:
    """A sentence that is only a noun phrase, as abstracts and annotations write them: "A long survey
    of the probabilistic relevance framework that explains where BM25 comes from." Its main clause
    (before a relative clause or a pause) holds no auxiliary, no word in -ed and no word in -s that
    could be a verb, so a sentence like "A study of documents shows…" is never taken for one."""
    words = sentence.split(maxsplit=1)
    if len(words) < 2 or words[0] not in {"A", "An"}:
        return False
    main = _MAIN_CLAUSE_END.split(words[1], maxsplit=1)[0]
    said = [w.lower() for w in re.findall(r"[A-Za-z]+", main)]
    if len(said) < 2:
        return False
    for word in said:
        if word in _AUXILIARIES or word.endswith("ed"):
            return False
        if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
            return False
    return True


def users_own(source: FusedResult) -> bool:
    """The user's own note, highlight or file (not a paper in their library)."""
    return source.kind == "library" and str(source.metadata.get("type", "")).lower() in _USERS_OWN


def authors_year(source: FusedResult) -> str | None:
    """ "Malkov and Yashunin (2018)", "Robertson et al. (2009)", "Malkov (2018)": None without authors."""
    authors = source.metadata.get("authors")
    if not isinstance(authors, list) or not authors:
        return None
    names = [_surname(str(name)) for name in authors if str(name).strip()]
    if not names:
        return None
    who = names[0] if len(names) == 1 else f"{names[0]} and {names[1]}" if len(names) == 2 else f"{names[0]} et al."
    year = source.metadata.get("year")
    return f"{who} ({year})" if year else who


def _surname(name: str) -> str:
    name = " ".join(name.split())
    if "," in name:
        return name.split(",", 1)[0].strip()
    return name.split(" ")[-1]


# a second verb of the same subject: "… as term vectors and ranks by similarity" (a noun after "and"
# is followed by its own words, not by a preposition or an article: "documents and queries as …")
_COORDINATED = re.compile(
    r"(\band )([a-z]{3,}(?<!ss)(?<!us)(?<!is)s)( (?:by|with|to|from|into|on|the|a|an|its|their|them|it|each|every)\b)"
)


def _plural(verb: str) -> str:
    """ "builds" -> "build", "applies" -> "apply", "uses" -> "use" (after a plural subject)."""
    if verb.endswith("ies") and len(verb) > 4:
        return verb[:-3] + "y"
    if verb.endswith(("sses", "shes", "ches", "xes", "zes")):
        return verb[:-2]
    return verb[:-1]


def attributed(sentence: str, source: FusedResult, note: str) -> str:
    """`sentence` said to be whose it is where it does not say so itself. `note` is the language's
    "Your note says: “{text}”"."""
    if users_own(source) and (first_person(sentence) or note_fragment(sentence)):
        return note.format(text=sentence)
    if verbless(sentence):  # "A long survey of …": "Robertson and Zaragoza (2009) present a long survey of …"
        if users_own(source):
            return note.format(text=sentence)
        said = sentence[:1].lower() + sentence[1:]
        who = authors_year(source)
        if who is not None:
            return f"{who} {'present' if ' and ' in who or 'et al.' in who else 'presents'} {said}"
        title = " ".join(source.title.split())
        return f"“{title}” presents {said}" if title and len(title) <= 90 else f"One source presents {said}"
    if not subjectless(sentence):
        return sentence
    who = authors_year(source)
    words = sentence.split()
    verb = words[0].lower()
    if who is not None:
        several = " and " in who or "et al." in who
        if not several:
            return " ".join([who, verb, *words[1:]])
        rest = _COORDINATED.sub(lambda m: f"{m.group(1)}{_plural(m.group(2))}{m.group(3)}", " ".join(words[1:]))
        return " ".join([who, _plural(verb), rest])
    if users_own(source):
        return note.format(text=sentence)
    title = " ".join(source.title.split())
    if title and len(title) <= 90:
        return " ".join([f"“{title}”", verb, *words[1:]])
    return " ".join(["One source", verb, *words[1:]])


# what `attributed` puts before a source's words: "Salton and Buckley (1988) ", "“A title” ",
# "Your note says: “…”" (any language's words before the quote)
# (and "present(s)" that `attributed` put before a sentence that is only a noun phrase)
_BY_WHOM = re.compile(
    r"^(?:(?:[^\s()“”\"]+ ){1,6}\((?:1[5-9]\d\d|20\d\d)[a-z]?\) |“[^”]{1,90}” |One source )(?:presents? (?=an? ))?"
)
_NOTE_SAYS = re.compile(r"^[^“”]{1,30}[:：]\s*“(.+)”\s*$", re.DOTALL)


def unattributed(sentence: str) -> str:
    """The source's own words of a sentence `attributed` said whose it is: what the verifier checks
    against the source (whose passage holds neither its authors nor its year)."""
    said = _NOTE_SAYS.match(sentence)
    if said:
        return said.group(1)
    return _BY_WHOM.sub("", sentence, count=1)
