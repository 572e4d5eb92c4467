"""User ids as one person reads them: two ids that look the same are the same id, or one of them
is refused.

A user id arrives as text from many places (identity headers, Open WebUI's token, the chat
body's ``user``, ``?user=``, a key's binding in ``MEMPROXY_API_KEYS``, a move's target, the
CLI's ``--user``), and the page shows it to people. Text that renders alike can differ in its
code points, so :func:`normal_user_id` makes it one:

- Unicode NFC: ``José`` typed with a combining accent (NFD, as macOS file names are) is the
  same user as ``José`` with the precomposed ``é``;
- refused: control characters, invisible and formatting characters (zero-width spaces and
  joiners, the soft hyphen, bidirectional controls such as U+202E, which reverses what
  follows; every character of Unicode's categories Cc, Cf, Co, Cs, Cn, Zl, Zp), spaces other
  than the plain space, and letters that render as nothing (Hangul fillers, variation
  selectors);
- refused: variant forms of other characters, those Unicode's compatibility normalisation
  (NFKC) replaces: fullwidth ``ａｌｉｃｅ``, mathematical ``𝐚𝐥𝐢𝐜𝐞``, Roman numerals ``aⅼice``,
  ligatures, superscripts, circled digits;
- refused: letters and numerals of scripts that can pass for each other in one id (UTS #39's
  "moderately restrictive" profile): an id of one script (``Алиса``, ``Ελένη``) is kept, as
  are Latin with one other script whose letters do not pass for Latin ones (``david-דוד``,
  :data:`LATIN_MIXES_WITH`) and the mixes of East Asian names (Han with Hiragana, Katakana,
  Hangul or Bopomofo, each also with Latin: ``Zoë-東京``); Latin with Cyrillic (``аlice``),
  Greek, Armenian, Cherokee or Lisu, two scripts without Latin, or three, are refused;
- kept: the zero-width non-joiner and joiner (U+200C, U+200D) where they change what is shown
  (IDNA's CONTEXTJ rules, RFC 5892): after a virama, before a letter of its script (``क्‍ष``,
  ``ශ්‍රී``), and the non-joiner between two Arabic letters that would join (``علی‌رضا``);
  anywhere else they show nothing and are refused;
- kept: a Cyrillic or Greek id every letter of which looks like a Latin one (``аӏісе``,
  ``ВОВ``, ``ροκ``; UTS #39's whole-script confusables), since real names are written so
  (``Вера``, ``АННА``): the memory page shows such an id's letters as code points
  (:data:`LOOK_LATIN`, the same table in its script), so that it cannot pass for a Latin one.

Digits, punctuation and marks belong to no script and mix with any.
"""

from __future__ import annotations

import unicodedata

MAX_USER_ID_LENGTH = 256
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp", "Zs"})
"""Unicode general categories no user id may hold (``Zs``: every space but U+0020)."""
BLANK_LETTERS = frozenset(
    [0x115F, 0x1160, 0x3164, 0xFFA0, 0x2800, 0x034F, 0x17B4, 0x17B5, 0x180B, 0x180C, 0x180D,
     *range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)]
)  # fmt: skip
"""Characters of other categories that render as nothing (fillers, variation selectors)."""
EAST_ASIAN = (
    frozenset({"LATIN", "HAN", "HIRAGANA", "KATAKANA"}),
    frozenset({"LATIN", "HAN", "BOPOMOFO"}),
    frozenset({"LATIN", "HAN", "HANGUL"}),
)
"""Scripts written together (Unicode's "highly restrictive" mixes, UTS #39)."""
LATIN_MIXES_WITH = frozenset({
    "ARABIC", "BENGALI", "BOPOMOFO", "DEVANAGARI", "ETHIOPIC", "GEORGIAN", "GUJARATI", "GURMUKHI",
    "HAN", "HANGUL", "HEBREW", "HIRAGANA", "KANNADA", "KATAKANA", "KHMER", "LAO", "MALAYALAM",
    "MYANMAR", "ORIYA", "SINHALA", "TAMIL", "TELUGU", "THAANA", "THAI", "TIBETAN",
})  # fmt: skip
"""The scripts Latin may mix with in one id: Unicode's recommended scripts (UAX #31, table 5)
but Cyrillic, Greek and Armenian, many letters of which pass for Latin ones (UTS #39's
"moderately restrictive" profile; Armenian as browsers add it). Scripts not recommended
(Cherokee, Lisu, Roman numerals...) mix with none."""
ZWNJ, ZWJ = "\u200c", "\u200d"
VIRAMA = 9
"""The canonical combining class of a virama (Devanagari's, Sinhala's al-lakuna...)."""
LOOK_LATIN = {
    "CYRILLIC": frozenset("аеорсухіјѕԁӏһԛԝԍѵүҽѡ" + "АВЕКМНОРСТУХІЈЅӀҺԚԜԌѴҮѠ"),
    "GREEK": frozenset("αικνορτυχγϲϳ" + "ΑΒΕΖΗΙΚΜΝΟΡΤΥΧϹͿ"),
}
"""The letters of these scripts that look like a Latin letter, as written (either case): an id
of one of these scripts made of them alone could pass for a Latin id, and the memory page shows
it escaped."""
_SCRIPT_OF_NAME = {
    "CJK": "HAN",
    "IDEOGRAPHIC": "HAN",
    "KATAKANA-HIRAGANA": "KATAKANA",
    "MODIFIER": "",  # modifier letters (the okina of Hawaiʻi) are of no script: they mix
}


class UserIdRefused(ValueError):
    """Why a user id cannot be used (the words follow "the user id ...")."""


def normal_user_id(raw: str) -> str:
    """`raw` trimmed and in NFC; :class:`UserIdRefused` saying why when it cannot be a user id
    (too long, a control, invisible or formatting character, a variant form, two scripts that
    pass for each other, letters that all pass for Latin ones). Empty stays empty: the callers
    decide what no user means."""
    value = unicodedata.normalize("NFC", raw.strip())
    if len(value) > MAX_USER_ID_LENGTH:
        raise UserIdRefused(f"is longer than {MAX_USER_ID_LENGTH} characters")
    scripts: set[str] = set()
    for at, char in enumerate(value):
        category = unicodedata.category(char)
        if char in (ZWNJ, ZWJ) and _joiner_shows(value, at):
            continue
        if char != " " and (category in REFUSED_CATEGORIES or ord(char) in BLANK_LETTERS):
            kind = "a control" if category == "Cc" else "an invisible or formatting"
            raise UserIdRefused(f"contains {kind} character (U+{ord(char):04X})")
        if (plain := unicodedata.normalize("NFKC", char)) != char:
            raise UserIdRefused(
                f"contains a variant form of {plain!r} (U+{ord(char):04X}), so it could pass for"
                " another id"
            )
        # Numerals too (Nl, No): a Roman numeral or a Gothic one passes for a letter.
        if (category[0] == "L" or category in ("Nl", "No")) and (script := script_of(char)):
            scripts.add(script)
    if not _mix_kept(scripts):
        names = " and ".join(sorted(s.title() for s in scripts))
        raise UserIdRefused(
            f"mixes letters of several scripts ({names}), so it could pass for another id"
        )
    return value


def stored_user_id(raw: str) -> str:
    """`raw` trimmed and otherwise as given, refused only when too long or holding a control
    character (the rule before ids were normalised): to name a user stored before, where that
    user's memories are given to another (a move's source), so that none is out of reach."""
    value = raw.strip()
    if len(value) > MAX_USER_ID_LENGTH:
        raise UserIdRefused(f"is longer than {MAX_USER_ID_LENGTH} characters")
    if any(unicodedata.category(char) == "Cc" for char in value):
        raise UserIdRefused("contains a control character")
    return value


def script_of(letter: str) -> str:
    """The script of a letter or numeral, as the first word of its Unicode name says it
    (``LATIN``, ``CYRILLIC``, ``HAN``, ``ROMAN``...); empty for modifier letters (of no
    script). Variant forms (fullwidth, halfwidth, mathematical) are refused before this asks."""
    first = unicodedata.name(letter, "UNKNOWN").split()[0]
    return _SCRIPT_OF_NAME.get(first, first)


def _mix_kept(scripts: set[str]) -> bool:
    """Whether letters of these scripts may stand in one id (UTS #39, moderately restrictive)."""
    if len(scripts) <= 1 or any(scripts <= allowed for allowed in EAST_ASIAN):
        return True
    return len(scripts) == 2 and "LATIN" in scripts and scripts - {"LATIN"} <= LATIN_MIXES_WITH


def _joiner_shows(value: str, at: int) -> bool:
    """Whether the ZWNJ or ZWJ at `at` changes what is shown (RFC 5892's CONTEXTJ rules, with a
    letter after it asked for): after a virama, before a letter of the virama's script; a ZWNJ
    also between an Arabic letter that joins what follows (vowel marks on it skipped, as IDNA's
    transparent ones are) and one that joins what precedes."""
    after = value[at + 1 : at + 2]
    if not after or not unicodedata.category(after).startswith("L"):
        return False
    before = value[at - 1] if at else ""
    if before and unicodedata.combining(before) == VIRAMA:
        return script_of(before) == script_of(after)
    letter = at - 1
    while letter >= 0 and unicodedata.category(value[letter]) == "Mn":
        letter -= 1
    joins = letter >= 0 and value[letter] in JOINS_NEXT and after in JOINS_PREVIOUS
    return value[at] == ZWNJ and joins


def _arabic_joining() -> tuple[frozenset[str], frozenset[str]]:
    """The Arabic letters that join the letter after them (they have an initial or medial form)
    and those that join the one before (a final or medial form), read from Unicode's
    presentation forms (Python's unicodedata has no joining types)."""
    joins_next: set[str] = set()
    joins_previous: set[str] = set()
    for code in (*range(0xFB50, 0xFE00), *range(0xFE70, 0xFF00)):
        name = unicodedata.name(chr(code), "")
        letter = unicodedata.normalize("NFKC", chr(code))
        if len(letter) == 1 and name.startswith("ARABIC LETTER"):
            if name.endswith(("INITIAL FORM", "MEDIAL FORM")):
                joins_next.add(letter)
            if name.endswith(("FINAL FORM", "MEDIAL FORM")):
                joins_previous.add(letter)
    return frozenset(joins_next), frozenset(joins_previous)


JOINS_NEXT, JOINS_PREVIOUS = _arabic_joining()
