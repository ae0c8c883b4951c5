"""The bench corpus: English-looking sentences of 10-40 words, generated from a fixed seed."""

from __future__ import annotations

import random


def words(text: str) -> list[str]:
    return text.split()


# Common English words by role, so that clauses read like text and tokenize like text (mostly one
# WordPiece per word, a few split into several), without shipping a data set.
DETERMINERS = words("the a this that every each some no one another their our his her its my your")
ADJECTIVES = words(
    "new old small large quick slow bright dark early late simple complex public private local global "
    "green red blue quiet loud cheap expensive modern ancient strong weak careful famous final recent "
    "important different similar common rare digital physical central northern southern useful heavy "
    "empty full narrow wide human natural financial medical legal technical fresh hidden"
)
NOUNS = words(
    "server model city river teacher student market company river engine window garden report story "
    "doctor patient system network customer policy country village machine library question answer "
    "document record price council museum bridge island forest kitchen contract budget project team "
    "player concert festival harbour mountain valley station airport hospital factory program database "
    "request letter message journey weather storm recipe camera painting scientist engineer farmer "
    "government election committee research experiment language history picture morning evening winter"
)
VERBS = words(
    "reads builds opens closes finds keeps sends shows changes follows watches explains describes "
    "improves reduces supports carries moves answers receives measures visits protects replaces "
    "announced released approved rejected reviewed designed delivered collected discovered repaired"
)
PREPOSITIONS = words("in on near behind under over across through during after before without beside toward")
ADVERBS = words("quickly slowly quietly carefully rarely often finally suddenly nearly almost again still")
CONJUNCTIONS = ["and", "but", "while", "because", "although", "so", "when", "after", "until", "since"]


def make_clause(rng: random.Random) -> list[str]:
    words = [rng.choice(DETERMINERS)]
    if rng.random() < 0.6:
        words.append(rng.choice(ADJECTIVES))
    words += [rng.choice(NOUNS)]
    if rng.random() < 0.3:
        words.append(rng.choice(ADVERBS))
    words += [rng.choice(VERBS), rng.choice(DETERMINERS)]
    if rng.random() < 0.5:
        words.append(rng.choice(ADJECTIVES))
    words.append(rng.choice(NOUNS))
    if rng.random() < 0.5:
        words += [rng.choice(PREPOSITIONS), rng.choice(DETERMINERS), rng.choice(NOUNS)]
    return words


def make_sentence(rng: random.Random, min_words: int = 10, max_words: int = 40) -> str:
    target = rng.randint(min_words, max_words)
    words = make_clause(rng)
    while len(words) < target:
        words[-1] += "," if rng.random() < 0.3 else ""
        words += [rng.choice(CONJUNCTIONS), *make_clause(rng)]
    words = words[:target]
    words[-1] = words[-1].rstrip(",")
    if rng.random() < 0.1:
        # A few digits, as real text has, so not every word is a whole-word token.
        words.insert(rng.randrange(1, len(words)), str(rng.randint(2, 2099)))
    text = " ".join(words)
    return text[0].upper() + text[1:] + ("?" if rng.random() < 0.1 else ".")


def make_sentences(count: int, seed: int = 0, min_words: int = 10, max_words: int = 40) -> list[str]:
    """`count` sentences; the same seed always gives the same list."""
    rng = random.Random(seed)
    return [make_sentence(rng, min_words, max_words) for _ in range(count)]


def make_long_text(rng: random.Random, words: int) -> str:
    """One paragraph of about `words` words, sentences of 10-40 words run together."""
    sentences: list[str] = []
    total = 0
    while total < words:
        sentence = make_sentence(rng)
        sentences.append(sentence)
        total += sentence.count(" ") + 1
    return " ".join(sentences)
