/* Optional accelerator of the log reader: the commonest lines of a busy SGLang log, in C.
 *
 * Contract (tests/test_scan_accel.py checks it against the pure-Python reader): for every line it is
 * given, this module either
 *   - skips it, when the pure-Python reader would produce nothing for it (uvicorn access lines, and
 *     lines holding none of the parser's dispatch markers),
 *   - returns the very Event the pure-Python parser returns, for a Decode/Prefill batch line with
 *     SGLang's own `[date time RANKS] ` prefix whose keys are all known and whose values are plain, or
 *   - stops, handing the line back to Python (anything else: other heads, odd values, non-ASCII,
 *     `\r`, ANSI colours, unknown keys...).
 * It keeps no state between lines and holds no table of its own: keys, markers, names and the Event
 * type all come from logparse through configure(), so the Python module stays the one definition.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { CONV_INT = 0, CONV_FLOAT = 1, CONV_BOOL = 2, CONV_RATIO = 3 };
enum { SKIP = 0, EMIT = 1, STOP = 2, FAIL = -1 };

#define MAX_KEYS 128
#define MAX_KEY_LEN 64
#define MAX_MARKERS 64
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

static PyObject *event_type, *empty_tuple;
static PyObject *d_line, *d_kind, *d_time, *d_rank, *d_fields; /* Event's slot descriptors */
static PyObject *kind_decode, *kind_prefill;
static PyObject *name_forward_iter, *name_token_usage, *name_graph_backend;
static PyObject *pool_names[N_POOLS];
static PyObject *rank_names[N_RANKS];
static const char *const rank_tags[N_RANKS] = {"DP", "PP", "TP", "EP", "ATTN_CP", "MOE_DP"};
static const size_t rank_tag_len[N_RANKS] = {2, 2, 2, 2, 7, 6};
static PyObject *last_time; /* the time string of the last event made */
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
 * `\r` (progress-bar fragments) or ESC (ANSI colours). */
static int special_bytes(const char *s, Py_ssize_t len) {
    if (memchr(s, '\r', (size_t)len) != NULL || memchr(s, 0x1b, (size_t)len) != NULL) return 1;
    uint64_t acc = 0;
    Py_ssize_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        acc |= w;
    }
    for (; i < len; i++) acc |= (unsigned char)s[i];
    return (acc & 0x8080808080808080ULL) != 0;
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

/* `-?[0-9]+` -> int; NULL without an exception when the text is anything else. */
static PyObject *plain_int(const char *v, Py_ssize_t n) {
    Py_ssize_t i = 0;
    int neg = 0;
    if (n > 0 && v[0] == '-') { neg = 1; i = 1; }
    if (i >= n || n - i > 18) return NULL;
    long long x = 0;
    for (; i < n; i++) {
        if (!is_digit(v[i])) return NULL;
        x = x * 10 + (v[i] - '0');
    }
    return PyLong_FromLongLong(neg ? -x : x);
}

static const double exact_pow10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                     1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* `-?[0-9]+(\.[0-9]+)?` -> float equal to Python's float() of it; NULL when anything else.
 * With at most 15 digits and 22 decimals both the digits and the power of ten are exact doubles, so
 * one IEEE division is correctly rounded (Clinger's fast path); longer numbers go to CPython's reader. */
static PyObject *plain_float(const char *v, Py_ssize_t n) {
    Py_ssize_t i = 0;
    if (n <= 0 || n >= 64) return NULL;
    int neg = v[0] == '-';
    if (neg) i = 1;
    Py_ssize_t start = i, frac_digits = 0, all_digits = 0;
    long long mant = 0;
    while (i < n && is_digit(v[i])) {
        mant = mant * 10 + (v[i++] - '0');
        all_digits++;
        if (all_digits > 18) return NULL;
    }
    if (i == start) return NULL;
    if (i < n) {
        if (v[i] != '.') return NULL;
        Py_ssize_t frac = ++i;
        while (i < n && is_digit(v[i])) {
            if (++all_digits > 18) return NULL;
            mant = mant * 10 + (v[i++] - '0');
        }
        frac_digits = i - frac;
        if (frac_digits == 0 || i != n) return NULL;
    }
    if (all_digits <= 15 && frac_digits <= 22) {
        double d = (double)mant / exact_pow10[frac_digits];
        return PyFloat_FromDouble(neg ? -d : d);
    }
    char buf[64];
    memcpy(buf, v, (size_t)n);
    buf[n] = '\0';
    char *end = NULL;
    double d = PyOS_string_to_double(buf, &end, NULL);
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    if (end != buf + n) return NULL;
    return PyFloat_FromDouble(d);
}

static PyObject *convert(int conv, const char *v, Py_ssize_t n) {
    switch (conv) {
    case CONV_INT:
        return plain_int(v, n);
    case CONV_FLOAT:
    case CONV_RATIO: /* a plain number: `12.3%` stops (Python rounds percentages its own way) */
        return plain_float(v, n);
    case CONV_BOOL:
        if (n == 4 && memcmp(v, "True", 4) == 0) Py_RETURN_TRUE;
        if (n == 5 && memcmp(v, "False", 5) == 0) Py_RETURN_FALSE;
        return NULL;
    }
    return NULL;
}

/* SGLang's own prefix `[YYYY-MM-DD HH:MM:SS(.f{1,6})?( TAGn)*] ` at s[0]: returns the offset just past
 * it (0 when not there); *clock_end is where the time ends; ranks go into `rank` (a new dict). */
static Py_ssize_t std_prefix(const char *s, Py_ssize_t len, Py_ssize_t *clock_end, PyObject **rank) {
    /* [2025-10-09 08:53:21 */
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
    *clock_end = i;
    PyObject *r = PyDict_New();
    if (r == NULL) return -1;
    while (i < len && s[i] == ' ') {
        Py_ssize_t a = ++i;
        while (i < len && ((s[i] >= 'A' && s[i] <= 'Z') || s[i] == '_')) i++;
        Py_ssize_t b = i;
        long long v = 0;
        while (i < len && is_digit(s[i]) && i - b < 18) v = v * 10 + (s[i++] - '0');
        if (a == b || i == b || (i < len && s[i] != ' ' && s[i] != ']')) goto no;
        int which = -1;
        for (int t = 0; t < N_RANKS; t++) {
            size_t tl = rank_tag_len[t];
            if ((size_t)(b - a) == tl && memcmp(s + a, rank_tags[t], tl) == 0) { which = t; break; }
        }
        if (which < 0) goto no; /* a tag Python's rank pattern ignores: leave the line to Python */
        PyObject *iv = PyLong_FromLongLong(v);
        if (iv == NULL || PyDict_SetItem(r, rank_names[which], iv) < 0) {
            Py_XDECREF(iv);
            Py_DECREF(r);
            return -1;
        }
        Py_DECREF(iv);
    }
    if (i + 1 >= len || s[i] != ']' || s[i + 1] != ' ') goto no;
    *rank = r;
    return i + 2;
no:
    Py_DECREF(r);
    return 0;
}

static int set_slot(PyObject *descr, PyObject *obj, PyObject *value) {
    descrsetfunc f = Py_TYPE(descr)->tp_descr_set;
    return f(descr, obj, value);
}

static PyObject *new_event(long long n, PyObject *kind, PyObject *time, PyObject *rank, PyObject *fields) {
    PyObject *e = PyBaseObject_Type.tp_new((PyTypeObject *)event_type, empty_tuple, NULL);
    if (e == NULL) return NULL;
    PyObject *line = PyLong_FromLongLong(n);
    if (line == NULL || set_slot(d_line, e, line) < 0 || set_slot(d_kind, e, kind) < 0
        || set_slot(d_time, e, time) < 0 || set_slot(d_rank, e, rank) < 0 || set_slot(d_fields, e, fields) < 0) {
        Py_XDECREF(line);
        Py_DECREF(e);
        return NULL;
    }
    Py_DECREF(line);
    return e;
}

/* A standard-prefix Decode/Prefill line -> EMIT (*out set), STOP or FAIL. */
static int batch_line(const char *s, Py_ssize_t len, long long n, PyObject **out, PyObject **kind_out) {
    Py_ssize_t clock_end = 0;
    PyObject *rank = NULL, *fields = NULL, *time = NULL, *fwd = NULL;
    PyObject *label = NULL;
    int status = STOP;
    Py_ssize_t h = std_prefix(s, len, &clock_end, &rank);
    if (h < 0) return FAIL;
    if (h == 0) return STOP;
    PyObject *kind;
    Py_ssize_t i;
    if (len - h >= 12 && memcmp(s + h, "Decode batch", 12) == 0) {
        kind = kind_decode;
        i = h + 12;
    } else if (len - h >= 13 && memcmp(s + h, "Prefill batch", 13) == 0) {
        kind = kind_prefill;
        i = h + 13;
        if (find(s, len, "Decode batch", 12) != NULL) goto done; /* Python reads the Decode head first */
    } else {
        goto done;
    }
    if (i + 1 < len && s[i] == ' ' && s[i + 1] == '[') { /* `Decode batch [N],` */
        Py_ssize_t a = i + 2, b = a;
        while (b < len && is_digit(s[b])) b++;
        if (b == a || b >= len || s[b] != ']') goto done;
        fwd = plain_int(s + a, b - a);
        if (fwd == NULL) goto done;
        i = b + 1;
    }
    if (i + 1 >= len || (s[i] != '.' && s[i] != ',') || s[i + 1] != ' ') goto done;
    Py_ssize_t b = i + 2, e = len;
    while (e > b && py_space((unsigned char)s[e - 1])) e--;
    while (e > b && s[e - 1] == ',') e--;
    if (e <= b) goto done;
    fields = PyDict_New();
    if (fields == NULL) goto fail;
    if (fwd != NULL && PyDict_SetItem(fields, name_forward_iter, fwd) < 0) goto fail;
    int pos = 0;
    while (b <= e) {
        const char *piece = s + b;
        const char *sep = find2(piece, e - b, ',', ' ');
        Py_ssize_t plen = sep ? sep - piece : e - b;
        const char *colon = find2(piece, plen, ':', ' ');
        if (colon == NULL) goto done; /* empty or malformed piece: Python counts it */
        int k = find_key(piece, colon - piece, pos++);
        if (k < 0) goto done; /* an unknown key: Python's rule names it */
        PyObject *v = convert(keys[k].conv, colon + 2, plen - (colon + 2 - piece));
        if (v == NULL) {
            if (PyErr_Occurred()) goto fail;
            goto done;
        }
        int rc = PyDict_SetItem(fields, keys[k].name, v);
        Py_DECREF(v);
        if (rc < 0) goto fail;
        if (keys[k].label != NULL) label = keys[k].label;
        if (sep == NULL) break;
        b += plen + 2;
    }
    if (label != NULL && PyDict_SetItem(fields, name_graph_backend, label) < 0) goto fail;
    int has_usage = PyDict_Contains(fields, name_token_usage);
    if (has_usage < 0) goto fail;
    if (!has_usage) {
        /* SGLang's own token_usage gauge is the fullest pool on hybrid models. */
        PyObject *best = NULL;
        for (int p = 0; p < N_POOLS; p++) {
            PyObject *u = PyDict_GetItemWithError(fields, pool_names[p]);
            if (u == NULL) {
                if (PyErr_Occurred()) goto fail;
                continue;
            }
            if (PyFloat_CheckExact(u) && (best == NULL || PyFloat_AS_DOUBLE(u) > PyFloat_AS_DOUBLE(best))) best = u;
        }
        if (best != NULL && PyDict_SetItem(fields, name_token_usage, best) < 0) goto fail;
    }
    /* time: `YYYY-MM-DDTHH:MM:SS(.fff)`; consecutive lines mostly share it (str is immutable) */
    if (last_time != NULL && PyUnicode_GET_LENGTH(last_time) == clock_end - 1
        && memcmp((const char *)PyUnicode_DATA(last_time) + 11, s + 12, (size_t)(clock_end - 12)) == 0
        && memcmp(PyUnicode_DATA(last_time), s + 1, 10) == 0) {
        time = Py_NewRef(last_time);
    } else {
        time = PyUnicode_New(clock_end - 1, 127);
        if (time == NULL) goto fail;
        char *t = (char *)PyUnicode_DATA(time);
        memcpy(t, s + 1, (size_t)(clock_end - 1));
        t[10] = 'T';
        Py_XSETREF(last_time, Py_NewRef(time));
    }
    *out = new_event(n, kind, time, rank, fields);
    *kind_out = kind;
    status = *out == NULL ? FAIL : EMIT;
    goto done;
fail:
    status = FAIL;
done:
    Py_XDECREF(rank);
    Py_XDECREF(fields);
    Py_XDECREF(time);
    Py_XDECREF(fwd);
    return status;
}

/* One line (without its newline, or with it: one trailing `\n` is ignored). */
static int scan_line(const char *s, Py_ssize_t len, long long n, PyObject **out, PyObject **kind) {
    if (len > 0 && s[len - 1] == '\n') len--;
    if (find(s, len, "HTTP/1.", 7) != NULL) return SKIP; /* uvicorn access line: never an event */
    if (special_bytes(s, len)) return STOP;
    if (!has_marker(s, len)) return SKIP; /* no handler of the parser would look at it */
    if (s[0] == '[') return batch_line(s, len, n, out, kind);
    return STOP;
}

static int emit(PyObject *out, PyObject *e, PyObject *kind, Py_ssize_t *nd, Py_ssize_t *np) {
    int rc = PyList_Append(out, e);
    Py_DECREF(e);
    if (kind == kind_decode) (*nd)++;
    else (*np)++;
    return rc;
}

static int ready(void) {
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "_scan.configure() has not been called");
        return 0;
    }
    return 1;
}

/* scan_lines(lines, start, first_line, out) -> (stop, decode, prefill)
 * Lines from index `start` (numbered from first_line) until one needs Python (index `stop`, or
 * len(lines)); events appended to `out`; decode/prefill count them. */
static PyObject *scan_lines(PyObject *self, PyObject *args) {
    PyObject *lines, *out;
    Py_ssize_t start;
    long long first;
    if (!PyArg_ParseTuple(args, "O!nLO!", &PyList_Type, &lines, &start, &first, &PyList_Type, &out)) return NULL;
    if (!ready()) return NULL;
    Py_ssize_t nd = 0, np = 0, i = start, total = PyList_GET_SIZE(lines);
    for (; i < total; i++) {
        PyObject *line = PyList_GET_ITEM(lines, i);
        if (!PyUnicode_CheckExact(line)) break;
#if PY_VERSION_HEX < 0x030C0000
        if (PyUnicode_READY(line) < 0) return NULL;
#endif
        if (!PyUnicode_IS_ASCII(line)) break;
        PyObject *e = NULL, *kind = NULL;
        int r = scan_line((const char *)PyUnicode_DATA(line), PyUnicode_GET_LENGTH(line), first + (i - start), &e,
                          &kind);
        if (r == FAIL) return NULL;
        if (r == STOP) break;
        if (r == EMIT && emit(out, e, kind, &nd, &np) < 0) return NULL;
    }
    return Py_BuildValue("nnn", i, nd, np);
}

/* scan_buffer(data, pos, first_line, out) -> (stop, line, decode, prefill)
 * Whole lines of UTF-8 bytes from offset `pos` (the last may lack its newline): as scan_lines, with
 * `stop` the offset of the line that needs Python (or len(data)) and `line` its number. */
static PyObject *scan_buffer(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t pos;
    long long n;
    PyObject *out;
    if (!PyArg_ParseTuple(args, "y*nLO!", &buf, &pos, &n, &PyList_Type, &out)) return NULL;
    if (!ready()) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    const char *data = (const char *)buf.buf;
    Py_ssize_t size = buf.len, nd = 0, np = 0;
    if (pos < 0) pos = 0;
    while (pos < size) {
        const char *nl = memchr(data + pos, '\n', (size_t)(size - pos));
        Py_ssize_t end = nl ? nl - data : size;
        PyObject *e = NULL, *kind = NULL;
        int r = scan_line(data + pos, end - pos, n, &e, &kind);
        if (r == FAIL) {
            PyBuffer_Release(&buf);
            return NULL;
        }
        if (r == STOP) break;
        if (r == EMIT && emit(out, e, kind, &nd, &np) < 0) {
            PyBuffer_Release(&buf);
            return NULL;
        }
        pos = end + 1;
        n++;
    }
    if (pos > size) pos = size;
    PyBuffer_Release(&buf);
    return Py_BuildValue("nLnn", pos, n, nd, np);
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

/* configure(event_type, descriptors, kinds, keys, markers, names, pools, ranks)
 *   descriptors: the Event slot descriptors (line, kind, time, rank, fields)
 *   kinds: (decode, prefill) kind strings; keys: [(raw, name, conv, label or None)]
 *   markers: substrings that send a line to Python; names: (forward_iter, token_usage, graph_backend)
 *   pools: the four pool-usage names, in Python's order; ranks: names of DP PP TP EP ATTN_CP MOE_DP */
static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *etype, *descrs, *kinds, *key_list, *marker_list, *names, *pools, *ranks;
    if (!PyArg_ParseTuple(args, "OO!O!O!O!O!O!O!", &etype, &PyTuple_Type, &descrs, &PyTuple_Type, &kinds,
                          &PyList_Type, &key_list, &PyList_Type, &marker_list, &PyTuple_Type, &names,
                          &PyTuple_Type, &pools, &PyTuple_Type, &ranks))
        return NULL;
    if (!PyType_Check(etype) || PyTuple_GET_SIZE(descrs) != 5 || PyTuple_GET_SIZE(kinds) != 2
        || PyTuple_GET_SIZE(names) != 3 || PyTuple_GET_SIZE(pools) != N_POOLS || PyTuple_GET_SIZE(ranks) != N_RANKS) {
        PyErr_SetString(PyExc_ValueError, "configure: wrong argument shapes");
        return NULL;
    }
    for (int i = 0; i < 5; i++) {
        PyObject *d = PyTuple_GET_ITEM(descrs, i);
        if (Py_TYPE(d)->tp_descr_set == NULL) {
            PyErr_SetString(PyExc_TypeError, "configure: a descriptor without __set__");
            return NULL;
        }
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
    KEEP(event_type, etype);
    KEEP(d_line, PyTuple_GET_ITEM(descrs, 0));
    KEEP(d_kind, PyTuple_GET_ITEM(descrs, 1));
    KEEP(d_time, PyTuple_GET_ITEM(descrs, 2));
    KEEP(d_rank, PyTuple_GET_ITEM(descrs, 3));
    KEEP(d_fields, PyTuple_GET_ITEM(descrs, 4));
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

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "Take the parser's tables (see logparse)."},
    {"scan_lines", scan_lines, METH_VARARGS, "scan_lines(lines, start, first_line, out) -> (stop, decode, prefill)"},
    {"scan_buffer", scan_buffer, METH_VARARGS,
     "scan_buffer(data, pos, first_line, out) -> (stop, next_line, decode, prefill)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", "C accelerator of the log reader.", -1, methods};

PyMODINIT_FUNC PyInit__scan(void) {
    empty_tuple = PyTuple_New(0);
    if (empty_tuple == NULL) return NULL;
    return PyModule_Create(&module);
}
