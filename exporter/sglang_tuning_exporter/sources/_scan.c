/* Optional accelerator of the log reader: the commonest lines of a busy SGLang log, in C.
 *
 * Contract (tests/sources/test_scan_accel.py checks it against the pure-Python reader): for every line it is
 * given, this module either
 *   - skips it, when the pure-Python reader would produce nothing for it (uvicorn access lines, and
 *     lines holding none of the parser's dispatch markers),
 *   - returns the very Event the pure-Python parser returns, for a Decode/Prefill batch line or the
 *     standard retraction line with SGLang's own `[date time RANKS] ` prefix, whose keys are all known
 *     and whose values are plain, or
 *   - stops, handing the line back to Python (anything else: other heads, odd values, non-ASCII,
 *     `\r`, ANSI colours, unknown keys...).
 * For diagnose, scan_buckets sums Decode/Prefill lines per (rank, time bucket) instead of making
 * Events, with stats.SampleStats.add's semantics (tests/offline/test_diagnose.py holds it to the Python path).
 * Between lines it keeps only caches that cannot change a result (the last time string, the key seen
 * at each position, recent bucket groups), and it holds no table of its own: keys, markers, names,
 * kinds and the Event type come from logparse through accel.configure(), so Python stays the one
 * definition. The GIL is held throughout.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

enum { CONV_INT = 0, CONV_FLOAT = 1, CONV_BOOL = 2, CONV_RATIO = 3 };
enum { SKIP = 0, EMIT = 1, STOP = 2, FAIL = -1 };

#define MAX_KEYS 128
#define MAX_KEY_LEN 64
#define MAX_MARKERS 128 /* logparse.dispatch_markers(): the batch heads, every dispatch gate, UNREAD_MARKERS */
#define MAX_MARKER_LEN 64
#define N_RANKS 6
#define N_POOLS 4
#define MAX_PAIRS 64

typedef struct {
    char raw[MAX_KEY_LEN];
    Py_ssize_t len;
    PyObject *name;   /* canonical field name (owned) */
    int conv;
    PyObject *label;  /* graph backend label for `npu graph` & co., or NULL (owned) */
} Key;

typedef struct {
    char text[MAX_MARKER_LEN];
    Py_ssize_t len;
} Marker;

static Key keys[MAX_KEYS];
static int n_keys;
static Marker markers[MAX_MARKERS];
static int n_markers;
static unsigned char pair_bits[65536 / 8]; /* first two bytes of some marker */
static int configured;

static PyTypeObject *event_type; /* Event: a tuple subclass of (line, kind, time, rank, fields) */
static PyObject *kind_decode, *kind_prefill;
static PyObject *name_forward_iter, *name_token_usage, *name_graph_backend;
static PyObject *pool_names[N_POOLS];
static PyObject *rank_names[N_RANKS];
static const char *const rank_tags[N_RANKS] = {"DP", "PP", "TP", "EP", "ATTN_CP", "MOE_DP"};
static const size_t rank_tag_len[N_RANKS] = {2, 2, 2, 2, 7, 6};
static PyObject *last_time; /* the time string of the last event made */
static Key rkeys[8];        /* retraction keys; [0] is the one an event must have */
static int n_rkeys;
static char rhead[96];
static Py_ssize_t rhead_len;
static PyObject *kind_retract, *name_ratio_before, *name_ratio_after;
static int expect_at[MAX_PAIRS]; /* key index seen at each position of the previous line: tried first */

static inline int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Python's str.isspace() on ASCII. */
static inline int py_space(unsigned char c) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

static const char *find(const char *s, Py_ssize_t len, const char *needle, Py_ssize_t nlen) {
    if (len < nlen) return NULL;
    return memmem(s, (size_t)len, needle, (size_t)nlen);
}

/* First `a` followed by `b` in s[0:len) (a two-byte separator; cheaper than memmem for these). */
static const char *find2(const char *s, Py_ssize_t len, char a, char b) {
    const char *end = s + len - 1;
    for (const char *p = s; p < end; p++) {
        p = memchr(p, a, (size_t)(end - p));
        if (p == NULL) return NULL;
        if (p[1] == b) return p;
    }
    return NULL;
}

static int digits(const char *s, Py_ssize_t i, Py_ssize_t len, int n) {
    if (i + n > len) return 0;
    for (int k = 0; k < n; k++)
        if (!is_digit(s[i + k])) return 0;
    return 1;
}

/* True when the line holds a byte the general parser treats specially: non-ASCII (decoding),
 * `\r` (progress-bar fragments) or ESC (ANSI colours), and with `nul` a NUL byte. One pass, eight bytes
 * at a time. */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
static inline uint64_t zero_byte(uint64_t w) { return (w - ONES) & ~w & HIGHS; } /* nonzero iff a byte is 0 */
static int special_bytes(const char *s, Py_ssize_t len, int nul) {
    uint64_t hit = 0, nul_mask = nul ? ~0ULL : 0;
    Py_ssize_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        hit |= (w & HIGHS) | zero_byte(w ^ (ONES * '\r')) | zero_byte(w ^ (ONES * 0x1b)) | (zero_byte(w) & nul_mask);
    }
    for (; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80 || c == '\r' || c == 0x1b || (nul && c == 0)) return 1;
    }
    return hit != 0;
}

/* `HTTP/1.` in the line (a uvicorn access line): memchr finds the rare 'H' fast. */
static int has_http(const char *s, Py_ssize_t len) {
    const char *p = s, *end = s + len;
    while (end - p >= 7 && (p = memchr(p, 'H', (size_t)(end - p - 6))) != NULL) {
        if (memcmp(p + 1, "TTP/1.", 6) == 0) return 1;
        p++;
    }
    return 0;
}

/* True when the line holds one of the parser's dispatch markers (found by their first two bytes). */
static int has_marker(const char *s, Py_ssize_t len) {
    for (Py_ssize_t i = 0; i + 1 < len; i++) {
        unsigned int pair = ((unsigned int)(unsigned char)s[i] << 8) | (unsigned char)s[i + 1];
        if (pair_bits[pair >> 3] & (1u << (pair & 7))) {
            for (int m = 0; m < n_markers; m++) {
                const Marker *mk = &markers[m];
                if (mk->len <= len - i && memcmp(s + i, mk->text, (size_t)mk->len) == 0) return 1;
            }
        }
    }
    return 0;
}

static int find_key(const char *k, Py_ssize_t klen, int pos) {
    if (pos < MAX_PAIRS) {
        int guess = expect_at[pos];
        if (guess >= 0 && guess < n_keys && keys[guess].len == klen && memcmp(keys[guess].raw, k, (size_t)klen) == 0)
            return guess;
    }
    for (int i = 0; i < n_keys; i++) {
        if (keys[i].len == klen && memcmp(keys[i].raw, k, (size_t)klen) == 0) {
            if (pos < MAX_PAIRS) expect_at[pos] = i;
            return i;
        }
    }
    return -1;
}

/* A plain value read into C: an int, a float or a bool, by the key's conversion. */
typedef struct {
    long long i;
    double d;
} Num;

/* `-?[0-9]+` (at most 18 digits) -> *out; 0 when the text is anything else. */
static int plain_int(const char *v, Py_ssize_t n, long long *out) {
    Py_ssize_t i = 0;
    int neg = 0;
    if (n > 0 && v[0] == '-') { neg = 1; i = 1; }
    if (i >= n || n - i > 18) return 0;
    long long x = 0;
    for (; i < n; i++) {
        if (!is_digit(v[i])) return 0;
        x = x * 10 + (v[i] - '0');
    }
    *out = neg ? -x : x;
    return 1;
}

static const double exact_pow10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                     1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* `-?[0-9]+(\.[0-9]+)?` -> *out equal to Python's float() of it; 0 when anything else.
 * With at most 15 digits and 22 decimals both the digits and the power of ten are exact doubles, so
 * one IEEE division is correctly rounded (Clinger's fast path); longer numbers go to CPython's reader. */
static int plain_float(const char *v, Py_ssize_t n, double *out) {
    Py_ssize_t i = 0;
    if (n <= 0 || n >= 64) return 0;
    int neg = v[0] == '-';
    if (neg) i = 1;
    Py_ssize_t start = i, frac_digits = 0, all_digits = 0;
    long long mant = 0;
    while (i < n && is_digit(v[i])) {
        if (++all_digits > 18) return 0; /* before multiplying: 19 digits may not fit */
        mant = mant * 10 + (v[i++] - '0');
    }
    if (i == start) return 0;
    if (i < n) {
        if (v[i] != '.') return 0;
        Py_ssize_t frac = ++i;
        while (i < n && is_digit(v[i])) {
            if (++all_digits > 18) return 0;
            mant = mant * 10 + (v[i++] - '0');
        }
        frac_digits = i - frac;
        if (frac_digits == 0 || i != n) return 0;
    }
    if (all_digits <= 15 && frac_digits <= 22) {
        double d = (double)mant / exact_pow10[frac_digits];
        *out = neg ? -d : d;
        return 1;
    }
    char buf[64];
    memcpy(buf, v, (size_t)n);
    buf[n] = '\0';
    char *end = NULL;
    double d = PyOS_string_to_double(buf, &end, NULL);
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (end != buf + n) return 0;
    *out = d;
    return 1;
}

/* The key's conversion of a value; 0 when the value is not plain (`12.3%` ratios included: Python
 * rounds percentages its own way). */
static int convert(int conv, const char *v, Py_ssize_t n, Num *out) {
    switch (conv) {
    case CONV_INT:
        return plain_int(v, n, &out->i);
    case CONV_FLOAT:
    case CONV_RATIO:
        return plain_float(v, n, &out->d);
    case CONV_BOOL:
        if (n == 4 && memcmp(v, "True", 4) == 0) { out->i = 1; return 1; }
        if (n == 5 && memcmp(v, "False", 5) == 0) { out->i = 0; return 1; }
        return 0;
    }
    return 0;
}

#define N_INTS 8192
static PyObject *ints[N_INTS]; /* ints 0..N_INTS-1 (values, ranks, histogram keys and counts), made once */

static PyObject *int_of(long long v) {
    if (v >= 0 && v < N_INTS) {
        if (ints[v] == NULL && (ints[v] = PyLong_FromLongLong(v)) == NULL) return NULL;
        return Py_NewRef(ints[v]);
    }
    return PyLong_FromLongLong(v);
}

static PyObject *num_object(int conv, const Num *v) {
    switch (conv) {
    case CONV_INT:
        return int_of(v->i);
    case CONV_BOOL:
        return Py_NewRef(v->i ? Py_True : Py_False);
    default:
        return PyFloat_FromDouble(v->d);
    }
}

/* One standard batch line, parsed into C values (the Event builder and the bucket accumulator both
 * start from it; neither needs the other's objects). */
typedef struct {
    PyObject *kind;           /* kind_decode or kind_prefill (borrowed) */
    Py_ssize_t clock_end;     /* s[1:clock_end] is the time, with 'T' at offset 10 */
    int has_tag[N_RANKS];
    long long tag[N_RANKS];
    int has_fwd;
    long long fwd;            /* `Decode batch [N],` */
    int n;                    /* pairs read */
    const Key *table;         /* what key[] indexes: the batch keys or the retraction keys */
    int key[MAX_PAIRS];
    Num val[MAX_PAIRS];
    int has_ratio;            /* retraction: `#new_token_ratio: a -> b` */
    double ratio[2];
} Line;

/* SGLang's own prefix `[YYYY-MM-DD HH:MM:SS(.f{1,6})?( TAGn)*] ` at s[0]: the offset just past it, or
 * 0 when it is not there (or holds a tag Python's rank pattern would ignore). */
static Py_ssize_t std_prefix(const char *s, Py_ssize_t len, Line *L) {
    if (len < 21 || s[0] != '[' || !digits(s, 1, len, 4) || s[5] != '-' || !digits(s, 6, len, 2) || s[8] != '-'
        || !digits(s, 9, len, 2) || s[11] != ' ' || !digits(s, 12, len, 2) || s[14] != ':'
        || !digits(s, 15, len, 2) || s[17] != ':' || !digits(s, 18, len, 2))
        return 0;
    Py_ssize_t i = 20;
    if (i < len && s[i] == '.') {
        Py_ssize_t f = ++i;
        while (i < len && is_digit(s[i]) && i - f < 7) i++;
        if (i == f || i - f > 6) return 0;
    }
    L->clock_end = i;
    memset(L->has_tag, 0, sizeof L->has_tag);
    while (i < len && s[i] == ' ') {
        Py_ssize_t a = ++i;
        while (i < len && ((s[i] >= 'A' && s[i] <= 'Z') || s[i] == '_')) i++;
        Py_ssize_t b = i;
        long long v = 0;
        while (i < len && is_digit(s[i]) && i - b < 18) v = v * 10 + (s[i++] - '0');
        if (a == b || i == b || (i < len && s[i] != ' ' && s[i] != ']')) return 0;
        int which = -1;
        for (int t = 0; t < N_RANKS; t++) {
            if ((size_t)(b - a) == rank_tag_len[t] && memcmp(s + a, rank_tags[t], rank_tag_len[t]) == 0) {
                which = t;
                break;
            }
        }
        if (which < 0) return 0;
        L->has_tag[which] = 1; /* a repeated tag: the last one wins, as in Python's dict */
        L->tag[which] = v;
    }
    if (i + 1 >= len || s[i] != ']' || s[i + 1] != ' ') return 0;
    return i + 2;
}

/* The end of `key: value, key: value` at s[b:e] into L (keys of `table`, values plain): EMIT or STOP. */
static int parse_pairs(const char *s, Py_ssize_t b, Py_ssize_t e, Line *L, const Key *table, int n_table) {
    while (e > b && py_space((unsigned char)s[e - 1])) e--;
    while (e > b && s[e - 1] == ',') e--;
    if (e <= b) return STOP;
    L->table = table;
    while (b <= e) {
        const char *piece = s + b;
        const char *sep = find2(piece, e - b, ',', ' ');
        Py_ssize_t plen = sep ? sep - piece : e - b;
        const char *colon = find2(piece, plen, ':', ' ');
        if (colon == NULL || L->n >= MAX_PAIRS) return STOP; /* empty or malformed piece: Python counts it */
        int k = table == keys ? find_key(piece, colon - piece, L->n) : -1;
        for (int j = 0; table != keys && j < n_table; j++)
            if (table[j].len == colon - piece && memcmp(table[j].raw, piece, (size_t)table[j].len) == 0) k = j;
        if (k < 0) return STOP; /* an unknown key: Python's rule names it */
        if (!convert(table[k].conv, colon + 2, plen - (colon + 2 - piece), &L->val[L->n])) return STOP;
        L->key[L->n++] = k;
        if (sep == NULL) break;
        b += plen + 2;
    }
    return EMIT;
}

/* `KV cache pool is full. Retract requests. #retracted_reqs: N, ...(, #new_token_ratio: a -> b)` after
 * the prefix (ending at h) into L, as logmessages.retract_line reads it: EMIT or STOP. */
static int parse_retract(const char *s, Py_ssize_t len, Py_ssize_t h, Line *L) {
    L->has_fwd = 0;
    L->n = 0;
    L->has_ratio = 0;
    L->kind = kind_retract;
    if (len - h < rhead_len || memcmp(s + h, rhead, (size_t)rhead_len) != 0) return STOP;
    Py_ssize_t b = h + rhead_len, e = len;
    const char *r = find(s + b, len - b, "#new_token_ratio: ", 18);
    if (r != NULL) {
        /* `a -> b` and nothing but blanks after it (Python ignores a tail; leave odd ones to it) */
        Py_ssize_t a0 = r - s + 18, a1 = a0;
        while (a1 < len && (is_digit(s[a1]) || s[a1] == '.')) a1++;
        if (len - a1 < 4 || memcmp(s + a1, " -> ", 4) != 0 || !plain_float(s + a0, a1 - a0, &L->ratio[0])) return STOP;
        Py_ssize_t b0 = a1 + 4, b1 = b0;
        while (b1 < len && (is_digit(s[b1]) || s[b1] == '.')) b1++;
        if (!plain_float(s + b0, b1 - b0, &L->ratio[1])) return STOP;
        for (Py_ssize_t i = b1; i < len; i++)
            if (!py_space((unsigned char)s[i])) return STOP;
        L->has_ratio = 1;
        e = r - s;
    }
    if (parse_pairs(s, b, e, L, rkeys, n_rkeys) != EMIT) return STOP;
    for (int i = 0; i < L->n; i++)
        if (L->key[i] == 0) return EMIT; /* rkeys[0] is #retracted_reqs, which the event must have */
    return STOP;
}

/* A standard-prefix Decode/Prefill line of known keys and plain values into L: EMIT or STOP. */
static int parse_batch(const char *s, Py_ssize_t len, Py_ssize_t h, Line *L) {
    L->has_fwd = 0;
    L->n = 0;
    L->has_ratio = 0;
    Py_ssize_t i;
    if (len - h >= 12 && memcmp(s + h, "Decode batch", 12) == 0) {
        L->kind = kind_decode;
        i = h + 12;
    } else if (len - h >= 13 && memcmp(s + h, "Prefill batch", 13) == 0) {
        L->kind = kind_prefill;
        i = h + 13;
    } else {
        return STOP;
    }
    if (i + 1 < len && s[i] == ' ' && s[i + 1] == '[') { /* `Decode batch [N],` */
        Py_ssize_t a = i + 2, b = a;
        while (b < len && is_digit(s[b])) b++;
        if (b == a || b >= len || s[b] != ']' || !plain_int(s + a, b - a, &L->fwd)) return STOP;
        L->has_fwd = 1;
        i = b + 1;
    }
    if (i + 1 >= len || (s[i] != '.' && s[i] != ',') || s[i + 1] != ' ') return STOP;
    return parse_pairs(s, i + 2, len, L, keys, n_keys);
}

/* A new Event(n, kind, time, rank, fields); borrows kind, time, rank and fields. Event is a tuple
 * subclass (checked by configure): built the way CPython's own tuple.__new__ builds a subclass
 * instance, allocated by the type (GC-tracked, its items NULL until set) and its five items filled
 * before anyone else can see it. Nothing writes into an Event once it is returned. */
static PyObject *new_event(long long n, PyObject *kind, PyObject *time, PyObject *rank, PyObject *fields) {
    PyObject *line = PyLong_FromLongLong(n);
    if (line == NULL) return NULL;
    PyObject *e = event_type->tp_alloc(event_type, 5);
    if (e == NULL) {
        Py_DECREF(line);
        return NULL;
    }
    PyTuple_SET_ITEM(e, 0, line); /* SET_ITEM steals: line is handed over, the rest get a reference */
    PyTuple_SET_ITEM(e, 1, Py_NewRef(kind));
    PyTuple_SET_ITEM(e, 2, Py_NewRef(time));
    PyTuple_SET_ITEM(e, 3, Py_NewRef(rank));
    PyTuple_SET_ITEM(e, 4, Py_NewRef(fields));
    return e;
}

/* The Event parse_line returns for a parsed line (fields in line order, the graph label, the derived
 * token_usage), or NULL with an exception. */
static PyObject *line_event(const char *s, const Line *L, long long n) {
    PyObject *rank = NULL, *fields = NULL, *time = NULL, *label = NULL, *e = NULL, *v = NULL;
    rank = PyDict_New();
    if (rank == NULL) goto done;
    for (int t = 0; t < N_RANKS; t++) {
        if (!L->has_tag[t]) continue;
        v = int_of(L->tag[t]);
        if (v == NULL || PyDict_SetItem(rank, rank_names[t], v) < 0) goto done;
        Py_CLEAR(v);
    }
    fields = PyDict_New();
    if (fields == NULL) goto done;
    if (L->has_fwd) {
        v = PyLong_FromLongLong(L->fwd);
        if (v == NULL || PyDict_SetItem(fields, name_forward_iter, v) < 0) goto done;
        Py_CLEAR(v);
    }
    for (int i = 0; i < L->n; i++) {
        const Key *k = &L->table[L->key[i]];
        v = num_object(k->conv, &L->val[i]);
        if (v == NULL || PyDict_SetItem(fields, k->name, v) < 0) goto done;
        Py_CLEAR(v);
        if (k->label != NULL) label = k->label;
    }
    for (int i = 0; L->has_ratio && i < 2; i++) {
        v = PyFloat_FromDouble(L->ratio[i]);
        if (v == NULL || PyDict_SetItem(fields, i ? name_ratio_after : name_ratio_before, v) < 0) goto done;
        Py_CLEAR(v);
    }
    if (label != NULL && PyDict_SetItem(fields, name_graph_backend, label) < 0) goto done;
    int has_usage = L->kind == kind_retract ? 1 : PyDict_Contains(fields, name_token_usage);
    if (has_usage < 0) goto done;
    if (!has_usage) {
        /* SGLang's own token_usage gauge is the fullest pool on hybrid models. */
        PyObject *best = NULL;
        for (int p = 0; p < N_POOLS; p++) {
            PyObject *u = PyDict_GetItemWithError(fields, pool_names[p]);
            if (u == NULL) {
                if (PyErr_Occurred()) goto done;
                continue;
            }
            if (PyFloat_CheckExact(u) && (best == NULL || PyFloat_AS_DOUBLE(u) > PyFloat_AS_DOUBLE(best))) best = u;
        }
        if (best != NULL && PyDict_SetItem(fields, name_token_usage, best) < 0) goto done;
    }
    /* time: `YYYY-MM-DDTHH:MM:SS(.fff)`; consecutive lines mostly share it (str is immutable) */
    Py_ssize_t clock_end = L->clock_end;
    if (last_time != NULL && PyUnicode_GET_LENGTH(last_time) == clock_end - 1
        && memcmp((const char *)PyUnicode_DATA(last_time) + 11, s + 12, (size_t)(clock_end - 12)) == 0
        && memcmp(PyUnicode_DATA(last_time), s + 1, 10) == 0) {
        time = Py_NewRef(last_time);
    } else {
        time = PyUnicode_New(clock_end - 1, 127);
        if (time == NULL) goto done;
        char *t = (char *)PyUnicode_DATA(time);
        memcpy(t, s + 1, (size_t)(clock_end - 1));
        t[10] = 'T';
        Py_XSETREF(last_time, Py_NewRef(time));
    }
    e = new_event(n, L->kind, time, rank, fields);
done:
    Py_XDECREF(v);
    Py_XDECREF(rank);
    Py_XDECREF(fields);
    Py_XDECREF(time);
    return e;
}

/* ---- bucket accumulator (diagnose) ------------------------------------------------------------
 * Per (kind, dp, pp, time bucket) group, what stats.SampleStats.add does per sample, in C: the
 * group is [acc (bytearray of ACC_N doubles), queue hist, running hist, missed hist, capped hist]. */
#define N_COLS 5
/* Column roles, in configure_columns' order: decode (running, usage, graph, throughput, queue);
 * prefill (new tokens, cached tokens, usage, running, queue). */
enum { D_RUN, D_USAGE, D_GRAPH, D_TP, D_QUEUE };
enum { P_NEW, P_CACHED, P_USAGE, P_RUN, P_QUEUE };
#define ACC_FIELDS(X) X(t_min) X(t_max) X(queue_n) X(queue_zero) X(queue_over) X(queue_under) \
    X(running_n) X(kv_n) X(kv_under) X(usage_sum) X(usage_max) X(capped_base) X(graph_n) X(graph_miss) \
    X(tp_n) X(tp_sum) X(new_sum) X(new_n) X(cached_sum) \
    X(pool_samples) X(full_n) X(full_usage_sum) X(swa_samples) X(swa_usage_sum) X(mamba_n) X(mamba_num_sum) \
    X(mamba_usage_sum) X(mamba_bound) X(swa_bound)
#define ACC_ENUM(name) A_##name,
enum { ACC_FIELDS(ACC_ENUM) ACC_N };
#define ACC_NAME(name) #name,
static const char *const acc_names[] = {ACC_FIELDS(ACC_NAME)};

static signed char col_of[2][MAX_KEYS];  /* column of each key's canonical name, or -1 */
static signed char pool_of[MAX_KEYS];    /* pool-usage index of each key's canonical name, or -1 */
/* A hybrid model's Decode fields observations.pool_pairs reads, in configure_columns' order. */
enum { H_FULL, H_SWA, H_MAMBA, H_MAMBA_NUM, N_HYBRID };
static signed char hybrid_of[MAX_KEYS];  /* hybrid role of each key's canonical name, or -1 */
static int columns_ready, hybrid_ready;

/* Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar (what calendar.timegm uses). */
static long long days_from_civil(long long y, long long m, long long d) {
    y -= m <= 2;
    long long era = (y >= 0 ? y : y - 399) / 400;
    long long yoe = y - era * 400;
    long long doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    long long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static long long num2(const char *s) { return (s[0] - '0') * 10 + (s[1] - '0'); }

/* Python's float floor division (float_floor_div), so bucket starts equal `(t // res) * res`. */
static double py_floordiv(double vx, double wx) {
    double mod = fmod(vx, wx);
    double div = (vx - mod) / wx;
    if (mod != 0.0 && ((wx < 0) != (mod < 0))) div -= 1.0;
    if (div == 0.0) return copysign(0.0, vx / wx);
    double fl = floor(div);
    if (div - fl > 0.5) fl += 1.0;
    return fl;
}

typedef struct {
    double res, usage_good, band_lo, band_hi;
    double *latest;   /* the latest stamp read so far (in/out) */
    double origin;    /* the grid's origin: bucket starts are origin + k * res */
    double earliest, until;  /* timeparse's plausible stamps: [earliest, until) (passed in, no table here) */
    double backward;  /* timeparse.BACKWARD_TOLERANCE_S */
    Py_ssize_t max_line;  /* a longer line is handed back (Python skips and counts it) */
    PyObject *hold;       /* a set of (dp, pp) whose window holds an open sample, or NULL */
    double pool_full, mamba_floor;  /* observations.POOL_FULL and MAMBA_SIZE_MIN; NaN: hybrid lines to Python */
} Params;

/* Whether the line's replica has a sample open in the Python window: its next line completes or
 * commits it there (window.add_sample), so the line is handed back, not summed here. -1 on error. */
static int held(const Params *P, int has_dp, long long dp, int has_pp, long long pp) {
    if (P->hold == NULL || PySet_GET_SIZE(P->hold) == 0) return 0;
    PyObject *k0 = has_dp ? PyLong_FromLongLong(dp) : Py_NewRef(Py_None);
    PyObject *k1 = has_pp ? PyLong_FromLongLong(pp) : Py_NewRef(Py_None);
    PyObject *key = (k0 && k1) ? PyTuple_Pack(2, k0, k1) : NULL;
    Py_XDECREF(k0);
    Py_XDECREF(k1);
    if (key == NULL) return -1;
    int r = PySet_Contains(P->hold, key);
    Py_DECREF(key);
    return r;
}

/* [YYYY-MM-DD HH:MM:SS(.f)] as epoch seconds, as timeparse.event_seconds and the diagnose scanner read
 * it (calendar.timegm: the month must exist, day/hour/minute are plain arithmetic); 0 when no date. */
static int stamp_seconds(const char *s, const Line *L, const Params *P, double *out) {
    long long y = num2(s + 1) * 100 + num2(s + 3), mo = num2(s + 6);
    if (y < 1 || mo < 1 || mo > 12) return 0;
    long long secs = (days_from_civil(y, mo, 1) + num2(s + 9) - 1) * 86400 + num2(s + 12) * 3600
                     + num2(s + 15) * 60;
    double t = (double)secs + (double)num2(s + 18);
    if (L->clock_end > 20) {
        long long frac = 0;
        for (Py_ssize_t i = 21; i < L->clock_end; i++) frac = frac * 10 + (s[i] - '0');
        t += (double)frac / exact_pow10[L->clock_end - 21];
    }
    /* timeparse.plausible_seconds: a cut-off or garbled stamp; Python times the line by its neighbours. */
    if (t < P->earliest || t >= P->until) return 0;
    *out = t;
    return 1;
}

#define N_HINTS 16
typedef struct {
    int valid;
    int kind;
    int has_dp, has_pp;
    long long dp, pp;
    double start;
    PyObject *group; /* borrowed from the groups dict */
} GroupHint;

/* Recent groups of one scan call (ranks interleave line by line), replaced round-robin. */
typedef struct {
    GroupHint entry[N_HINTS];
    unsigned next;
} Hints;

/* A group's value histograms (queue, running, missed, capped) in C: open addressing, int64 value ->
 * count, so a line costs no Python object; group_hists() hands them over sorted, as FrozenHist
 * arrays. Held by a capsule in the group list. */
#define N_HISTS 4
#define HIST_EMPTY LLONG_MIN /* no value: plain_int reads at most 18 digits */
typedef struct {
    long long *key, *count;
    Py_ssize_t cap, n; /* cap a power of two, or 0 before the first value */
} CHist;

typedef struct {
    CHist h[N_HISTS];
} GroupHists;

static const char *const hists_capsule = "sglang_tuning_exporter._scan.hists";

static void hists_free(PyObject *capsule) {
    GroupHists *g = PyCapsule_GetPointer(capsule, hists_capsule);
    if (g == NULL) return;
    for (int i = 0; i < N_HISTS; i++) {
        PyMem_Free(g->h[i].key);
        PyMem_Free(g->h[i].count);
    }
    PyMem_Free(g);
}

static inline size_t hist_slot(long long v, Py_ssize_t cap) {
    return (size_t)(((uint64_t)v * 0x9E3779B97F4A7C15ULL) >> 17) & (size_t)(cap - 1);
}

static int hist_grow(CHist *h) {
    Py_ssize_t cap = h->cap ? h->cap * 2 : 64;
    long long *key = PyMem_Malloc(sizeof(long long) * (size_t)cap), *count = PyMem_Malloc(sizeof(long long) * (size_t)cap);
    if (key == NULL || count == NULL) {
        PyMem_Free(key);
        PyMem_Free(count);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < cap; i++) key[i] = HIST_EMPTY;
    for (Py_ssize_t i = 0; i < h->cap; i++) {
        if (h->key[i] == HIST_EMPTY) continue;
        size_t j = hist_slot(h->key[i], cap);
        while (key[j] != HIST_EMPTY) j = (j + 1) & (size_t)(cap - 1);
        key[j] = h->key[i];
        count[j] = h->count[i];
    }
    PyMem_Free(h->key);
    PyMem_Free(h->count);
    h->key = key;
    h->count = count;
    h->cap = cap;
    return 0;
}

static int hist_inc(CHist *h, long long v) {
    if ((h->n + 1) * 4 > h->cap * 3 && hist_grow(h) < 0) return -1; /* load at most 3/4 */
    size_t j = hist_slot(v, h->cap);
    while (h->key[j] != HIST_EMPTY) {
        if (h->key[j] == v) {
            h->count[j]++;
            return 0;
        }
        j = (j + 1) & (size_t)(h->cap - 1);
    }
    h->key[j] = v;
    h->count[j] = 1;
    h->n++;
    return 0;
}

/* Sort (value, count) pairs by value: quicksort with an inline compare, insertion sort for short runs. */
typedef struct {
    long long k, c;
} KeyCount;

static void sort_pairs(KeyCount *a, Py_ssize_t n) {
    while (n > 16) {
        long long p = a[n / 2].k;
        Py_ssize_t i = 0, j = n - 1;
        for (;;) {
            while (a[i].k < p) i++;
            while (a[j].k > p) j--;
            if (i >= j) break;
            KeyCount t = a[i];
            a[i++] = a[j];
            a[j--] = t;
        }
        /* [0, j] <= p <= [j+1, n): recurse into the smaller part, loop on the larger */
        Py_ssize_t left = j + 1;
        if (left < n - left) {
            sort_pairs(a, left);
            a += left;
            n -= left;
        } else {
            sort_pairs(a + left, n - left);
            n = left;
        }
    }
    for (Py_ssize_t i = 1; i < n; i++) {
        KeyCount t = a[i];
        Py_ssize_t j = i;
        while (j > 0 && a[j - 1].k > t.k) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = t;
    }
}

/* (typecode, values, cumulative counts) of n pairs sorted here: 'i' when every value and the total fit
 * 32 bits, else 'q'. */
static PyObject *frozen_arrays(KeyCount *kc, Py_ssize_t n) {
    sort_pairs(kc, n);
    int narrow = 1;
    long long total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (kc[i].c > LLONG_MAX - total) {
            PyErr_SetString(PyExc_OverflowError, "histogram total past 64 bits");
            return NULL;
        }
        total += kc[i].c;
        kc[i].c = total;
        if (kc[i].k < INT32_MIN || kc[i].k > INT32_MAX) narrow = 0;
    }
    if (total > INT32_MAX) narrow = 0;
    size_t width = narrow ? sizeof(int32_t) : sizeof(int64_t);
    PyObject *keys = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(width * (size_t)n));
    PyObject *cum = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(width * (size_t)n));
    if (keys == NULL || cum == NULL) {
        Py_XDECREF(keys);
        Py_XDECREF(cum);
        return NULL;
    }
    char *kp = PyBytes_AS_STRING(keys), *cp = PyBytes_AS_STRING(cum);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (narrow) {
            int32_t a = (int32_t)kc[i].k, b = (int32_t)kc[i].c;
            memcpy(kp + 4 * i, &a, 4);
            memcpy(cp + 4 * i, &b, 4);
        } else {
            memcpy(kp + 8 * i, &kc[i].k, 8);
            memcpy(cp + 8 * i, &kc[i].c, 8);
        }
    }
    return Py_BuildValue("(CNN)", narrow ? 'i' : 'q', keys, cum);
}

/* group_hists(capsule) -> four (typecode, values, cumulative counts): a group's histograms, sorted. */
static PyObject *group_hists(PyObject *self, PyObject *capsule) {
    (void)self;
    GroupHists *g = PyCapsule_GetPointer(capsule, hists_capsule);
    if (g == NULL) return NULL;
    PyObject *out = PyTuple_New(N_HISTS);
    if (out == NULL) return NULL;
    for (int i = 0; i < N_HISTS; i++) {
        const CHist *h = &g->h[i];
        KeyCount *kc = PyMem_Malloc(sizeof(KeyCount) * (size_t)(h->n > 0 ? h->n : 1));
        if (kc == NULL) {
            Py_DECREF(out);
            return PyErr_NoMemory();
        }
        Py_ssize_t n = 0;
        for (Py_ssize_t j = 0; j < h->cap; j++)
            if (h->key[j] != HIST_EMPTY) kc[n++] = (KeyCount){h->key[j], h->count[j]};
        PyObject *arrays = frozen_arrays(kc, n);
        PyMem_Free(kc);
        if (arrays == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, arrays);
    }
    return out;
}

static PyObject *new_group(void) {
    PyObject *g = PyList_New(2);
    if (g == NULL) return NULL;
    PyObject *acc = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(ACC_N * sizeof(double)));
    if (acc == NULL) {
        Py_DECREF(g);
        return NULL;
    }
    double *A = (double *)PyByteArray_AS_STRING(acc);
    for (int i = 0; i < ACC_N; i++) A[i] = 0.0;
    A[A_usage_max] = -1.0; /* SampleStats' own start */
    A[A_t_min] = INFINITY;   /* the first line sets both */
    A[A_t_max] = -INFINITY;
    PyList_SET_ITEM(g, 0, acc);
    GroupHists *gh = PyMem_Calloc(1, sizeof(GroupHists));
    if (gh == NULL) {
        Py_DECREF(g);
        return PyErr_NoMemory();
    }
    PyObject *cap = PyCapsule_New(gh, hists_capsule, hists_free);
    if (cap == NULL) {
        PyMem_Free(gh);
        Py_DECREF(g);
        return NULL;
    }
    PyList_SET_ITEM(g, 1, cap);
    return g;
}


/* timeparse.LogClock's tolerance: a stamp more than `backward` seconds before or after the latest
 * (0: none yet) is not taken as written. */
static int off_clock(double t, const Params *P) {
    return t < *P->latest - P->backward || (*P->latest > 0.0 && t > *P->latest + P->backward);
}

/* Add the line to its group; STOP when running or queue is missing or the stamp is no calendar date
 * (Python reads that line), FAIL on an exception. */
static int line_accumulate(const char *s, const Line *L, const Params *P, PyObject *groups[2], Hints *hint,
                           double *t_out) {
    int ki = L->kind == kind_decode ? 0 : 1;
    const Num *vals[N_COLS] = {NULL};
    const Num *pools[N_POOLS] = {NULL};
    const Num *hy[N_HYBRID] = {NULL};
    for (int i = 0; i < L->n; i++) {
        int k = L->key[i];
        if (col_of[ki][k] >= 0) vals[(int)col_of[ki][k]] = &L->val[i];
        if (pool_of[k] >= 0) pools[(int)pool_of[k]] = &L->val[i];
        if (hybrid_of[k] >= 0) hy[(int)hybrid_of[k]] = &L->val[i];
    }
    /* A Decode line of a hybrid model (a SWA or mamba pool) also feeds the hybrid-pool sums
     * (observations.pool_pairs): summed below with the thresholds Python hands over, else Python reads it. */
    int hybrid = ki == 0 && (hy[H_SWA] != NULL || hy[H_MAMBA] != NULL);
    if (hybrid && !(hybrid_ready && P->pool_full == P->pool_full && P->mamba_floor == P->mamba_floor)) return STOP;
    int uc = ki == 0 ? D_USAGE : P_USAGE;
    if (vals[uc] == NULL) { /* token_usage derived from the fullest pool, as the parser does */
        for (int p = 0; p < N_POOLS; p++)
            if (pools[p] != NULL && (vals[uc] == NULL || pools[p]->d > vals[uc]->d)) vals[uc] = pools[p];
    }
    const Num *run = vals[ki == 0 ? D_RUN : P_RUN], *queue = vals[ki == 0 ? D_QUEUE : P_QUEUE];
    if (run == NULL || queue == NULL) return STOP;
    double t;
    if (!stamp_seconds(s, L, P, &t)) return STOP;
    /* Stamped far off the latest: an outlier, a gap or a clock set back; Python's log clock decides.
     * Tested first: two comparisons, where held() builds a key while any replica holds a sample open. */
    if (off_clock(t, P)) return STOP;
    int open = held(P, L->has_tag[0], L->tag[0], L->has_tag[1], L->tag[1]);
    if (open < 0) return FAIL;
    if (open) return STOP;
    if (t > *P->latest) *P->latest = t;
    double start = py_floordiv(t - P->origin, P->res) * P->res + P->origin;
    int has_dp = L->has_tag[0], has_pp = L->has_tag[1];
    long long dp = L->tag[0], pp = L->tag[1];
    PyObject *group = NULL;
    /* Ranks interleave line by line: a few recent groups are remembered, not just the last one. */
    for (int h = 0; h < N_HINTS && group == NULL; h++) {
        const GroupHint *g = &hint->entry[h];
        if (g->valid && g->kind == ki && g->has_dp == has_dp && g->has_pp == has_pp && (!has_dp || g->dp == dp)
            && (!has_pp || g->pp == pp) && g->start == start)
            group = g->group;
    }
    if (group == NULL) {
        PyObject *k0 = has_dp ? PyLong_FromLongLong(dp) : Py_NewRef(Py_None);
        PyObject *k1 = has_pp ? PyLong_FromLongLong(pp) : Py_NewRef(Py_None);
        PyObject *k2 = PyFloat_FromDouble(start);
        PyObject *key = (k0 && k1 && k2) ? PyTuple_Pack(3, k0, k1, k2) : NULL;
        Py_XDECREF(k0);
        Py_XDECREF(k1);
        Py_XDECREF(k2);
        if (key == NULL) return FAIL;
        group = PyDict_GetItemWithError(groups[ki], key);
        if (group == NULL) {
            int rc = -1;
            if (!PyErr_Occurred() && (group = new_group()) != NULL) {
                rc = PyDict_SetItem(groups[ki], key, group);
                Py_DECREF(group); /* the dict holds it */
            }
            if (rc < 0) {
                Py_DECREF(key);
                return FAIL;
            }
        }
        Py_DECREF(key);
        hint->entry[hint->next++ % N_HINTS] = (GroupHint){1, ki, has_dp, has_pp, dp, pp, start, group};
    }
    double *A = (double *)PyByteArray_AS_STRING(PyList_GET_ITEM(group, 0));
    GroupHists *gh = PyCapsule_GetPointer(PyList_GET_ITEM(group, 1), hists_capsule);
    if (gh == NULL) return FAIL;
    CHist *qh = &gh->h[0], *rh = &gh->h[1], *mh = &gh->h[2], *ch = &gh->h[3];
    if (t < A[A_t_min]) A[A_t_min] = t;
    if (t > A[A_t_max]) A[A_t_max] = t;
    /* SampleStats.add(queue, running, usage, graph, throughput) */
    long long q = queue->i, r = run->i;
    A[A_queue_n] += 1.0;
    if (q == 0) A[A_queue_zero] += 1.0;
    if ((double)q > P->band_hi) A[A_queue_over] += 1.0;
    else if ((double)q < P->band_lo) A[A_queue_under] += 1.0;
    if (hist_inc(qh, q) < 0) return FAIL;
    A[A_running_n] += 1.0;
    if (hist_inc(rh, r) < 0) return FAIL;
    if (vals[uc] != NULL) {
        double u = vals[uc]->d;
        A[A_kv_n] += 1.0;
        A[A_usage_sum] += u;
        if (u > A[A_usage_max]) A[A_usage_max] = u;
        int under = u < P->usage_good && q > 0;
        if (under) A[A_kv_under] += 1.0;
        A[A_capped_base] += 1.0;
        if (under && hist_inc(ch, r) < 0) return FAIL;
    }
    if (ki == 0) {
        if (vals[D_GRAPH] != NULL) {
            A[A_graph_n] += 1.0;
            if (!vals[D_GRAPH]->i) {
                A[A_graph_miss] += 1.0;
                if (hist_inc(mh, r) < 0) return FAIL;
            }
        }
        if (vals[D_TP] != NULL) {
            A[A_tp_n] += 1.0;
            A[A_tp_sum] += vals[D_TP]->d;
        }
        if (hybrid) { /* observations.pool_pairs(line), with its thresholds */
            const Num *full = hy[H_FULL], *swa = hy[H_SWA], *mamba = hy[H_MAMBA], *used = hy[H_MAMBA_NUM];
            A[A_pool_samples] += 1.0;
            if (full != NULL) {
                A[A_full_n] += 1.0;
                A[A_full_usage_sum] += full->d;
            }
            if (swa != NULL) {
                A[A_swa_samples] += 1.0;
                A[A_swa_usage_sum] += swa->d;
            }
            if (used != NULL && mamba != NULL && mamba->d >= P->mamba_floor) {
                A[A_mamba_n] += 1.0;
                A[A_mamba_num_sum] += (double)used->i;
                A[A_mamba_usage_sum] += mamba->d;
            }
            if (q > 0 && (full == NULL || full->d < P->pool_full)) { /* requests wait, full attention has room */
                if (mamba != NULL && mamba->d >= P->pool_full) A[A_mamba_bound] += 1.0;
                if (swa != NULL && swa->d >= P->pool_full) A[A_swa_bound] += 1.0;
            }
        }
    } else {
        if (vals[P_NEW] != NULL) {
            A[A_new_sum] += (double)vals[P_NEW]->i;
            A[A_new_n] += 1.0;
        }
        if (vals[P_CACHED] != NULL) A[A_cached_sum] += (double)vals[P_CACHED]->i;
    }
    *t_out = t;
    return EMIT;
}

/* One line (without its newline, or with it: one trailing `\n` is ignored). Events go to *out; with
 * `groups` set, batch lines go to the bucket accumulator instead. */
static int scan_line(const char *s, Py_ssize_t len, long long n, PyObject **out, PyObject **kind,
                     PyObject *groups[2], const Params *P, Hints *hint, double *t_out) {
    if (len > 0 && s[len - 1] == '\n') len--;
    if (has_http(s, len)) {
        /* uvicorn access line: never an event; diagnose's scanner still reads a CR line holding a head */
        return (groups != NULL && memchr(s, '\r', (size_t)len) != NULL) ? STOP : SKIP;
    }
    if (special_bytes(s, len, groups != NULL)) return STOP; /* diagnose also hands NUL lines back: it counts them */
    if (!has_marker(s, len)) return SKIP; /* no handler of the parser would look at it */
    if (s[0] != '[') return STOP;
    Line L;
    Py_ssize_t h = std_prefix(s, len, &L);
    if (h == 0) return STOP;
    int r = (h < len && s[h] == 'K') ? (rhead_len ? parse_retract(s, len, h, &L) : STOP) : parse_batch(s, len, h, &L);
    if (r != EMIT) return r;
    *kind = L.kind;
    if (groups != NULL && L.kind != kind_retract) return line_accumulate(s, &L, P, groups, hint, t_out);
    if (groups != NULL && (!stamp_seconds(s, &L, P, t_out) || off_clock(*t_out, P)))
        return STOP; /* an event diagnose cannot time, or not as written */
    if ((*out = line_event(s, &L, n)) == NULL) return FAIL;
    return EMIT;
}

/* Counts by kind: decode, prefill, retract. */
static void count(PyObject *kind, Py_ssize_t counts[3]) {
    counts[kind == kind_decode ? 0 : kind == kind_prefill ? 1 : 2]++;
}

static int emit(PyObject *out, PyObject *e, PyObject *kind, Py_ssize_t counts[3]) {
    int rc = PyList_Append(out, e);
    Py_DECREF(e);
    count(kind, counts);
    return rc;
}

static int ready(void) {
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "_scan.configure() has not been called");
        return 0;
    }
    return 1;
}

/* The loop of scan_buffer and scan_buckets over whole lines of `data` from `*pos`. */
static int buffer_loop(const char *data, Py_ssize_t size, Py_ssize_t *pos, long long *n, PyObject *out,
                       PyObject *groups[2], const Params *P, Py_ssize_t counts[3], double *last_t) {
    Hints hint;
    memset(&hint, 0, sizeof hint);
    while (*pos < size) {
        const char *nl = memchr(data + *pos, '\n', (size_t)(size - *pos));
        Py_ssize_t end = nl ? nl - data : size;
        PyObject *e = NULL, *kind = NULL;
        double t = 0.0;
        if (P != NULL && end - *pos > P->max_line) break; /* over-long: Python skips and counts it */
        int r = scan_line(data + *pos, end - *pos, *n, &e, &kind, groups, P, &hint, &t);
        if (r == FAIL) return -1;
        if (r == STOP) break;
        if (r == EMIT) {
            if (groups != NULL) *last_t = t;
            if (e == NULL) count(kind, counts); /* summed into its bucket */
            else if (emit(out, e, kind, counts) < 0) return -1;
        }
        *pos = end + 1;
        (*n)++;
    }
    if (*pos > size) *pos = size;
    return 0;
}

/* scan_buffer(data, pos, first_line, out) -> (stop, line, decode, prefill, retract)
 * Whole lines of UTF-8 bytes from offset `pos` (the last may lack its newline) until one needs Python:
 * `stop` is its offset (or len(data)) and `line` its number; events appended to `out`. */
static PyObject *scan_buffer(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    Py_ssize_t pos, counts[3] = {0, 0, 0};
    long long n;
    PyObject *out;
    if (!PyArg_ParseTuple(args, "y*nLO!", &buf, &pos, &n, &PyList_Type, &out)) return NULL;
    if (!ready()) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (pos < 0) pos = 0;
    double last_t = 0.0;
    int rc = buffer_loop((const char *)buf.buf, buf.len, &pos, &n, out, NULL, NULL, counts, &last_t);
    PyBuffer_Release(&buf);
    if (rc < 0) return NULL;
    return Py_BuildValue("nLnnn", pos, n, counts[0], counts[1], counts[2]);
}

/* scan_buckets(data, pos, first_line, out, decode_groups, prefill_groups, resolution, usage_good,
 *              band_lo, band_hi[, latest, backward, origin, earliest, until, max_line, hold])
 *   -> (stop, line, decode, prefill, retract, latest or None)
 * A Decode/Prefill line or retraction stamped more than `backward` seconds before or after `latest` (the
 * latest stamp read, kept across calls by the caller; 0: none) is handed back.
 * As scan_buffer, but each Decode/Prefill line is added to its group
 * groups[(dp, pp, (t // resolution) * resolution)] = [acc, histograms (a capsule: group_hists)] (see
 * line_accumulate) instead of becoming an Event; last_time is the epoch time of the last line read. */
static PyObject *scan_buckets(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    Py_ssize_t pos, counts[3] = {0, 0, 0};
    long long n;
    PyObject *out, *groups[2];
    Params P;
    double latest = 0.0;
    P.latest = &latest;
    P.backward = 1e300;
    P.origin = 0.0;
    P.earliest = -1e300;
    P.until = 1e300;
    P.max_line = PY_SSIZE_T_MAX;
    P.hold = NULL;
    P.pool_full = P.mamba_floor = NAN;
    if (!PyArg_ParseTuple(args, "y*nLO!O!O!dddd|dddddnOdd", &buf, &pos, &n, &PyList_Type, &out, &PyDict_Type,
                          &groups[0], &PyDict_Type, &groups[1], &P.res, &P.usage_good, &P.band_lo, &P.band_hi,
                          &latest, &P.backward, &P.origin, &P.earliest, &P.until, &P.max_line, &P.hold,
                          &P.pool_full, &P.mamba_floor))
        return NULL;
    if (P.hold == Py_None) P.hold = NULL;
    if (P.hold != NULL && !PyAnySet_Check(P.hold)) {
        PyErr_SetString(PyExc_TypeError, "scan_buckets: hold must be a set or None");
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (!ready() || !columns_ready || !(P.res > 0.0)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "scan_buckets: configure_columns() first, and a positive resolution");
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (pos < 0) pos = 0;
    double last_t = 0.0;
    int rc = buffer_loop((const char *)buf.buf, buf.len, &pos, &n, out, groups, &P, counts, &last_t);
    PyBuffer_Release(&buf);
    if (rc < 0) return NULL;
    if (counts[0] + counts[1] + counts[2] == 0)
        return Py_BuildValue("nLnnnO", pos, n, counts[0], counts[1], counts[2], Py_None);
    return Py_BuildValue("nLnnnd", pos, n, counts[0], counts[1], counts[2], last_t > latest ? last_t : latest);
}

static void clear_config(void) {
    for (int i = 0; i < n_keys; i++) {
        Py_CLEAR(keys[i].name);
        Py_CLEAR(keys[i].label);
    }
    n_keys = 0;
    n_markers = 0;
    memset(pair_bits, 0, sizeof pair_bits);
    configured = 0;
    columns_ready = hybrid_ready = 0;
    rhead_len = 0;
}

static int ascii_copy(PyObject *str, char *dst, Py_ssize_t cap, Py_ssize_t *len, const char *what) {
    if (!PyUnicode_Check(str) || !PyUnicode_IS_ASCII(str) || PyUnicode_GET_LENGTH(str) >= cap
        || PyUnicode_GET_LENGTH(str) < 1) {
        PyErr_Format(PyExc_ValueError, "%s must be a non-empty ASCII str shorter than %zd", what, cap);
        return -1;
    }
    *len = PyUnicode_GET_LENGTH(str);
    memcpy(dst, PyUnicode_DATA(str), (size_t)*len);
    dst[*len] = '\0';
    return 0;
}

#define KEEP(var, value) do { PyObject *_v = (value); Py_INCREF(_v); Py_XSETREF(var, _v); } while (0)

/* configure(event_type, kinds, keys, markers, names, pools, ranks)
 *   event_type: Event, a tuple subclass holding (line, kind, time, rank, fields) and nothing else
 *   kinds: (decode, prefill) kind strings; keys: [(raw, name, conv, label or None)]
 *   markers: substrings that send a line to Python; names: (forward_iter, token_usage, graph_backend)
 *   pools: the four pool-usage names, in Python's order; ranks: names of DP PP TP EP ATTN_CP MOE_DP */
static PyObject *configure(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *etype, *kinds, *key_list, *marker_list, *names, *pools, *ranks;
    if (!PyArg_ParseTuple(args, "OO!O!O!O!O!O!", &etype, &PyTuple_Type, &kinds,
                          &PyList_Type, &key_list, &PyList_Type, &marker_list, &PyTuple_Type, &names,
                          &PyTuple_Type, &pools, &PyTuple_Type, &ranks))
        return NULL;
    if (!PyType_Check(etype) || PyTuple_GET_SIZE(kinds) != 2
        || PyTuple_GET_SIZE(names) != 3 || PyTuple_GET_SIZE(pools) != N_POOLS || PyTuple_GET_SIZE(ranks) != N_RANKS) {
        PyErr_SetString(PyExc_ValueError, "configure: wrong argument shapes");
        return NULL;
    }
    /* new_event fills a tuple's items and nothing more: a type with state of its own (a __dict__,
     * member slots, weak references) would need its __new__, and a hashable one a hash cache (tuples
     * have one since CPython 3.14), so those are refused (accel.load then keeps the Python reader). */
    PyTypeObject *et = (PyTypeObject *)etype;
    if (!PyType_IsSubtype(et, &PyTuple_Type) || et->tp_basicsize != PyTuple_Type.tp_basicsize
        || et->tp_itemsize != PyTuple_Type.tp_itemsize || et->tp_dictoffset != 0 || et->tp_weaklistoffset != 0
        || et->tp_hash != PyObject_HashNotImplemented) {
        PyErr_SetString(PyExc_TypeError,
                        "configure: the event type must be an unhashable tuple subclass without state of its own");
        return NULL;
    }
    if (PyList_GET_SIZE(key_list) > MAX_KEYS || PyList_GET_SIZE(marker_list) > MAX_MARKERS) {
        PyErr_SetString(PyExc_ValueError, "configure: too many keys or markers");
        return NULL;
    }
    clear_config();
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(key_list); i++) {
        PyObject *item = PyList_GET_ITEM(key_list, i), *raw, *name, *label;
        int conv;
        if (!PyArg_ParseTuple(item, "UUiO", &raw, &name, &conv, &label)) goto bad;
        Key *k = &keys[n_keys];
        if (ascii_copy(raw, k->raw, MAX_KEY_LEN, &k->len, "a key") < 0) goto bad;
        if (conv < CONV_INT || conv > CONV_RATIO) {
            PyErr_SetString(PyExc_ValueError, "configure: unknown conversion");
            goto bad;
        }
        k->conv = conv;
        Py_INCREF(name);
        k->name = name;
        k->label = NULL;
        if (label != Py_None) {
            Py_INCREF(label);
            k->label = label;
        }
        n_keys++;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(marker_list); i++) {
        Marker *m = &markers[n_markers];
        if (ascii_copy(PyList_GET_ITEM(marker_list, i), m->text, MAX_MARKER_LEN, &m->len, "a marker") < 0) goto bad;
        if (m->len < 2) {
            PyErr_SetString(PyExc_ValueError, "configure: markers need two characters at least");
            goto bad;
        }
        unsigned int pair = ((unsigned int)(unsigned char)m->text[0] << 8) | (unsigned char)m->text[1];
        pair_bits[pair >> 3] |= (unsigned char)(1u << (pair & 7));
        n_markers++;
    }
    Py_INCREF(etype);
    Py_XSETREF(event_type, et);
    KEEP(kind_decode, PyTuple_GET_ITEM(kinds, 0));
    KEEP(kind_prefill, PyTuple_GET_ITEM(kinds, 1));
    KEEP(name_forward_iter, PyTuple_GET_ITEM(names, 0));
    KEEP(name_token_usage, PyTuple_GET_ITEM(names, 1));
    KEEP(name_graph_backend, PyTuple_GET_ITEM(names, 2));
    for (int i = 0; i < N_POOLS; i++) KEEP(pool_names[i], PyTuple_GET_ITEM(pools, i));
    for (int i = 0; i < N_RANKS; i++) KEEP(rank_names[i], PyTuple_GET_ITEM(ranks, i));
    for (int i = 0; i < MAX_PAIRS; i++) expect_at[i] = -1;
    configured = 1;
    Py_RETURN_NONE;
bad:
    clear_config();
    return NULL;
}

static int name_index(PyObject *name, PyObject *names) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        int eq = PyObject_RichCompareBool(name, PyTuple_GET_ITEM(names, i), Py_EQ);
        if (eq < 0) return -2;
        if (eq) return (int)i;
    }
    return -1;
}

/* configure_columns(decode_names, prefill_names[, hybrid_names]): the canonical field names of the column
 * roles (decode: running, usage, graph, throughput, queue; prefill: new, cached, usage, running, queue)
 * and of a hybrid Decode line's pool fields (full usage, SWA usage, mamba usage, mamba num). */
static PyObject *configure_columns(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *names[2], *hybrid = NULL;
    if (!PyArg_ParseTuple(args, "O!O!|O!", &PyTuple_Type, &names[0], &PyTuple_Type, &names[1], &PyTuple_Type,
                          &hybrid))
        return NULL;
    if (!ready()) return NULL;
    columns_ready = hybrid_ready = 0;
    if (hybrid != NULL && PyTuple_GET_SIZE(hybrid) != N_HYBRID) {
        PyErr_Format(PyExc_ValueError, "configure_columns: %d hybrid names", N_HYBRID);
        return NULL;
    }
    for (int k = 0; k < n_keys; k++) {
        int h = hybrid != NULL ? name_index(keys[k].name, hybrid) : -1;
        if (h < -1) return NULL;
        hybrid_of[k] = (signed char)h;
    }
    for (int ki = 0; ki < 2; ki++) {
        if (PyTuple_GET_SIZE(names[ki]) != N_COLS) {
            PyErr_Format(PyExc_ValueError, "configure_columns: %d names per kind", N_COLS);
            return NULL;
        }
        if (PyObject_RichCompareBool(PyTuple_GET_ITEM(names[ki], ki == 0 ? D_USAGE : P_USAGE), name_token_usage,
                                     Py_EQ) != 1) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "configure_columns: the usage column is token_usage");
            return NULL;
        }
        for (int k = 0; k < n_keys; k++) {
            int c = name_index(keys[k].name, names[ki]);
            if (c < -1) return NULL;
            col_of[ki][k] = (signed char)c;
        }
    }
    for (int k = 0; k < n_keys; k++) {
        pool_of[k] = -1;
        for (int p = 0; p < N_POOLS; p++) {
            int eq = PyObject_RichCompareBool(keys[k].name, pool_names[p], Py_EQ);
            if (eq < 0) return NULL;
            if (eq) pool_of[k] = (signed char)p;
        }
    }
    columns_ready = 1;
    hybrid_ready = hybrid != NULL;
    Py_RETURN_NONE;
}

/* configure_retract(kind, head, keys, ratio_names): SGLang's standard retraction line, as
 * logmessages.retract_line reads it. head: the text after the prefix; keys: [(raw, name)] (ints), the first
 * being the one an event must have; ratio_names: (before, after). */
static PyObject *configure_retract(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *kind, *head, *key_list, *ratio;
    if (!PyArg_ParseTuple(args, "UUO!O!", &kind, &head, &PyList_Type, &key_list, &PyTuple_Type, &ratio)) return NULL;
    if (!ready()) return NULL;
    if (PyList_GET_SIZE(key_list) < 1 || PyList_GET_SIZE(key_list) > 8 || PyTuple_GET_SIZE(ratio) != 2) {
        PyErr_SetString(PyExc_ValueError, "configure_retract: 1 to 8 keys and two ratio names");
        return NULL;
    }
    rhead_len = 0;
    for (int i = 0; i < n_rkeys; i++) Py_CLEAR(rkeys[i].name);
    n_rkeys = 0;
    Py_ssize_t hl;
    if (ascii_copy(head, rhead, (Py_ssize_t)sizeof rhead, &hl, "the retraction head") < 0) return NULL;
    if (rhead[0] != 'K') { /* scan_line tells the heads apart by their first letter */
        PyErr_SetString(PyExc_ValueError, "configure_retract: the head must start with 'K'");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(key_list); i++) {
        PyObject *raw, *name;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(key_list, i), "UU", &raw, &name)) goto bad;
        Key *k = &rkeys[n_rkeys];
        if (ascii_copy(raw, k->raw, MAX_KEY_LEN, &k->len, "a key") < 0) goto bad;
        k->conv = CONV_INT;
        k->label = NULL;
        k->name = Py_NewRef(name);
        n_rkeys++;
    }
    KEEP(kind_retract, kind);
    KEEP(name_ratio_before, PyTuple_GET_ITEM(ratio, 0));
    KEEP(name_ratio_after, PyTuple_GET_ITEM(ratio, 1));
    rhead_len = hl;
    Py_RETURN_NONE;
bad:
    for (int i = 0; i < n_rkeys; i++) Py_CLEAR(rkeys[i].name);
    n_rkeys = 0;
    return NULL;
}

/* freeze_hist(hist) -> (typecode, values, cumulative counts): a dict of int value -> positive int
 * count as FrozenHist arrays (see frozen_arrays). TypeError/ValueError/OverflowError when it is not
 * such a dict. */
static PyObject *freeze_hist(PyObject *self, PyObject *hist) {
    (void)self;
    if (!PyDict_Check(hist)) {
        PyErr_SetString(PyExc_TypeError, "freeze_hist: a dict");
        return NULL;
    }
    Py_ssize_t n = PyDict_GET_SIZE(hist), pos = 0, i = 0;
    KeyCount *kc = PyMem_Malloc(sizeof(KeyCount) * (size_t)(n > 0 ? n : 1));
    if (kc == NULL) return PyErr_NoMemory();
    PyObject *k, *v, *out = NULL;
    while (PyDict_Next(hist, &pos, &k, &v) && i < n) {
        int ok = 0, vk = 0;
        if (!PyLong_CheckExact(k) || !PyLong_CheckExact(v)) {
            PyErr_SetString(PyExc_TypeError, "freeze_hist: int keys and counts");
            goto done;
        }
        kc[i].k = PyLong_AsLongLongAndOverflow(k, &ok);
        kc[i].c = PyLong_AsLongLongAndOverflow(v, &vk);
        if (ok || vk) {
            PyErr_SetString(PyExc_OverflowError, "freeze_hist: past 64 bits");
            goto done;
        }
        if (kc[i].c < 1) {
            PyErr_SetString(PyExc_ValueError, "freeze_hist: counts must be positive");
            goto done;
        }
        i++;
    }
    out = frozen_arrays(kc, n);
done:
    PyMem_Free(kc);
    return out;
}

static PyMethodDef methods[] = {
    {"freeze_hist", freeze_hist, METH_O, "freeze_hist(hist) -> (typecode, values, cumulative counts)"},
    {"group_hists", group_hists, METH_O, "group_hists(hists) -> four (typecode, values, cumulative counts)"},
    {"configure", configure, METH_VARARGS, "Take the parser's tables (see logparse)."},
    {"scan_buffer", scan_buffer, METH_VARARGS,
     "scan_buffer(data, pos, first_line, out) -> (stop, next_line, decode, prefill, retract)"},
    {"configure_columns", configure_columns, METH_VARARGS, "Name the columns of scan_buckets."},
    {"configure_retract", configure_retract, METH_VARARGS, "Take the parser's retraction line."},
    {"scan_buckets", scan_buckets, METH_VARARGS,
     "scan_buckets(data, pos, first_line, out, decode_groups, prefill_groups, resolution, usage_good, band_lo, "
     "band_hi) -> (stop, next_line, decode, prefill, retract, last_time)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", "C accelerator of the log reader.", -1, methods,
                                    NULL, NULL, NULL, NULL};

#ifndef SCAN_SOURCE
#define SCAN_SOURCE "unknown"
#endif

PyMODINIT_FUNC PyInit__scan(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    /* the digest of the _scan.c this was built from (setup.py: its CRC-32 and length): accel.load refuses a build from another */
    if (PyModule_AddStringConstant(m, "SOURCE", SCAN_SOURCE) < 0) goto fail;
    PyObject *names = PyTuple_New(ACC_N);
    if (names == NULL) goto fail;
    for (int i = 0; i < ACC_N; i++) {
        PyObject *v = PyUnicode_FromString(acc_names[i]);
        if (v == NULL) {
            Py_DECREF(names);
            goto fail;
        }
        PyTuple_SET_ITEM(names, i, v);
    }
    if (PyModule_AddObject(m, "ACC_FIELDS", names) < 0) { /* the layout of a group's accumulator */
        Py_DECREF(names);
        goto fail;
    }
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
