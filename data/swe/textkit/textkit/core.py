import re
import unicodedata

_SMALL = {"a", "an", "and", "as", "at", "but", "by", "for", "in", "of", "on", "or", "the", "to"}


def slugify(text, sep="-"):
    """Lowercase ASCII words of `text` joined by `sep` ("Héllo, World!" -> "hello-world")."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    words = re.findall(r"[a-z0-9]+", ascii_text.lower())
    return sep.join(words)


def truncate(text, width, suffix="..."):
    """`text` cut to at most `width` characters, ending in `suffix` when it was cut."""
    if width < len(suffix):
        raise ValueError("width is shorter than the suffix")
    if len(text) <= width:
        return text
    return text[: width - len(suffix)] + suffix


def word_count(text):
    """{word: count} of the lowercased words of `text` (apostrophes stay inside words)."""
    counts = {}
    for word in re.findall(r"[a-z0-9']+", text.lower()):
        word = word.strip("'")
        if word:
            counts[word] = counts.get(word, 0) + 1
    return counts


def title_case(text):
    """Title case that keeps short function words lowercase, except first and last."""
    words = text.split()
    out = []
    for i, word in enumerate(words):
        lower = word.lower()
        if 0 < i < len(words) - 1 and lower in _SMALL:
            out.append(lower)
        else:
            out.append(lower[:1].upper() + lower[1:])
    return " ".join(out)
