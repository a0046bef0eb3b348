"""Which text search configuration (stemmer and stop words) a document's lexical index uses.

English text is stemmed as English; text in another language Postgres ships a Snowball stemmer and stop-word
list for is stemmed as that language; anything else (other scripts, tables of numbers and codes, mixed text)
gets the neutral 'simple' configuration, so nothing is stemmed as a language it is not. The decision is made
once per document, from the share of each language's most frequent function words among its words.
"""

from __future__ import annotations

import re
from collections import Counter

# The commonest function words of each language with a Postgres configuration that has a stop-word list.
# Short lists are enough: in running text these words make up a large share of all words.
FUNCTION_WORDS: dict[str, frozenset[str]] = {
    "english": frozenset("the of and to in is that for it with as was on are be by this which or from at an not "
                         "have has were their its".split()),
    "german": frozenset("der die und in den von zu das mit sich des auf für ist im dem nicht ein eine als auch "
                        "es an werden aus er hat dass sie nach wird bei".split()),
    "french": frozenset("le la les de des et en un une du est que qui dans pour pas sur au par avec il elle "
                        "sont ce ne se aux".split()),
    "spanish": frozenset("el la los las de del y en un una que es por con para se no al lo como más su sus "
                         "pero está son".split()),
    "italian": frozenset("il lo la gli le di del della e in un una che è per con non si da al dei delle sono "
                         "nel alla".split()),
    "portuguese": frozenset("o a os as de do da dos das e em um uma que é para com não se por no na ao mais "
                            "como são".split()),
    "dutch": frozenset("de het een en van in is dat op te zijn met voor niet aan er ook als bij door om maar "
                       "wordt".split()),
    "swedish": frozenset("och att det som en på är av för med till den har de inte om ett var jag men".split()),
    "russian": frozenset("и в не на что с по это как а то из к за от он она для но все так же был".split()),
}
# Below this share of function words no language is claimed.
MIN_SHARE = 0.08
SAMPLE_WORDS = 5000
_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)


def text_search_config(text: str) -> str:
    """The Postgres text search configuration for a document's text (its first words are enough)."""
    words = [w.lower() for w in _WORD.findall(text[: SAMPLE_WORDS * 12])][:SAMPLE_WORDS]
    if not words:
        return "simple"
    counts = Counter(words)
    shares = {language: sum(counts[w] for w in vocabulary) / len(words)
              for language, vocabulary in FUNCTION_WORDS.items()}
    language, share = max(shares.items(), key=lambda item: item[1])
    return language if share >= MIN_SHARE else "simple"
