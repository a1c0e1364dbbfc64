/* ale.core._eventscan: the bulk chain check's scan of a batch of trajectory lines, in one pass.
 *
 * The bulk path of the verifier's chain check (ale/core/trajectory.py, "the bulk path") vouches for
 * a batch of lines with a few C-level passes: orjson parses the batch, writes every event back in
 * its canonical form (compared with the batch byte for byte), the members are checked a column at
 * a time and each line's body is hashed. This module makes one pass instead, over lines of the
 * plainest form only, and builds only what the checks after it read. It VOUCHES ONLY, as the bulk
 * path does: scan() returns None whenever a line is not of that form, and the Python bulk path then
 * checks the batch as before (and, on any doubt, the exact loop). For a batch it does not refuse,
 * the bulk path's own passes would have vouched for it too and read the same values
 * (tests/test_eventscan.py holds the two together over hostile batches).
 *
 * A line of the plainest form is an event's canonical JSON as orjson writes it (keys sorted), all
 * printable ASCII, at most MAX_LINE bytes, and ending in a newline:
 *
 *   {"data":{D},"hash":"H","kind":"S","monotonic":N,"prev_hash":"H","producer":"S",
 *    "producer_sequence":I,"schema":"ale-trajectory-event/v1","seq":I,"wall_time":"W"}
 *
 *   D  members "key":value, keys strictly increasing (byte order, no backslash in a key); a value
 *      a string, a number, true, false or null (nothing nested: data with an object or an array in
 *      it is left to the Python path)
 *   S  a string: printable ASCII without '"' or '\', or the escapes \" \\ \n \r \t (in D's values;
 *      no escape in a kind or producer)
 *   H  64 lowercase hex digits
 *   I  an integer in canonical form (no leading zero, no -0), of magnitude at most 2^53 - 1
 *   N  I, or a float in plain decimal form (no exponent) that is not integral and is exactly its
 *      shortest round-trip repr (Python's repr(float), which RFC 8785 and orjson write alike for
 *      every magnitude that repr writes without an exponent: ale/core/canonical.py)
 *   W  27 characters of the form 0000-00-00T00:00:00.000000Z, each 0 a digit
 *
 * and, across the batch, each line's hash is the SHA-256 of the line without its '"hash":"'
 * member (ale.core._linehash's body), each prev_hash is the hash of the line before, and seq goes
 * on by one.
 *
 * scan(buffer) -> None | (count, first_seq, first_prev_hash, last_hash, first_wall_time,
 *                          last_wall_time, producers, producer_sequences, monotonics, kinds, spans)
 *   producers, producer_sequences, monotonics, kinds: a list each, one value a line; spans: each
 *   line's data object as two native unsigned 32-bit offsets into the buffer (start, end), packed
 *   in bytes (the Python side parses the data of the few lines it reads).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <openssl/evp.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define MAX_LINE (1 << 20)          /* trajectory.MAX_LINE_BYTES */
#define SAFE_INT 9007199254740991LL /* 2^53 - 1: orjson's OPT_STRICT_INTEGER */
#define HASH_KEY "\"hash\":\""
#define HASH_MEMBER_LEN (8 + 64 + 2) /* '"hash":"', the digits and '",' */
#define MAX_NUMBER 40                /* a number's text longer than this is left to the Python path */
#define CACHED 16                    /* distinct producers / kinds a batch's str objects are shared for */

static EVP_MD *sha256;

typedef struct {
    const char *p;
    const char *end; /* the line's newline */
} Cursor;

static int literal(Cursor *c, const char *text, size_t length) {
    if ((size_t)(c->end - c->p) < length || memcmp(c->p, text, length) != 0) {
        return 0;
    }
    c->p += length;
    return 1;
}

#define LITERAL(c, text) literal((c), (text), sizeof(text) - 1)

/* A string (see S above); escapes: whether \" \\ \n \r \t may appear. Its contents in [*start, *stop). */
static int string(Cursor *c, int escapes, const char **start, const char **stop) {
    if (c->p >= c->end || *c->p != '"') {
        return 0;
    }
    const char *p = c->p + 1;
    *start = p;
    while (p < c->end) {
#if defined(__SSE2__)
        /* 16 bytes at a time while none is special: '"', '\\', below 0x20, 0x7f or above (a
         * signed byte below 0x20 is one of 0x00-0x1f or 0x80-0xff) */
        while (c->end - p >= 16) {
            __m128i chunk = _mm_loadu_si128((const __m128i *)p);
            __m128i special = _mm_or_si128(
                _mm_or_si128(_mm_cmplt_epi8(chunk, _mm_set1_epi8(0x20)), _mm_cmpeq_epi8(chunk, _mm_set1_epi8(0x7f))),
                _mm_or_si128(_mm_cmpeq_epi8(chunk, _mm_set1_epi8('"')), _mm_cmpeq_epi8(chunk, _mm_set1_epi8('\\'))));
            int mask = _mm_movemask_epi8(special);
            if (mask != 0) {
                p += __builtin_ctz((unsigned)mask);
                break;
            }
            p += 16;
        }
        if (p >= c->end) {
            break;
        }
#endif
        unsigned char ch = (unsigned char)*p;
        if (ch == '"') {
            *stop = p;
            c->p = p + 1;
            return 1;
        }
        if (ch == '\\') {
            if (!escapes || p + 1 >= c->end) {
                return 0;
            }
            char e = p[1];
            if (e != '"' && e != '\\' && e != 'n' && e != 'r' && e != 't') {
                return 0;
            }
            p += 2;
            continue;
        }
        if (ch < 0x20 || ch > 0x7e) {
            return 0;
        }
        p++;
    }
    return 0;
}

static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

/* A number's text (see N above) at c->p: 1 an integer (*value), 2 a float (*real), 0 neither. */
static int number(Cursor *c, long long *value, double *real) {
    const char *p = c->p, *start = c->p;
    int negative = 0;
    if (p < c->end && *p == '-') {
        negative = 1;
        p++;
    }
    if (p >= c->end || !is_digit(*p)) {
        return 0;
    }
    if (*p == '0') {
        p++;
        if (p < c->end && is_digit(*p)) {
            return 0; /* a leading zero */
        }
    } else {
        while (p < c->end && is_digit(*p)) {
            p++;
        }
    }
    if (p < c->end && (*p == 'e' || *p == 'E')) {
        return 0;
    }
    if (p >= c->end || *p != '.') { /* an integer */
        Py_ssize_t digits = p - start - negative;
        if (digits > 16) {
            return 0;
        }
        long long v = 0;
        for (const char *q = start + negative; q < p; q++) {
            v = v * 10 + (*q - '0');
        }
        if (v > SAFE_INT || (negative && v == 0)) {
            return 0; /* beyond 53 bits, or -0 */
        }
        *value = negative ? -v : v;
        c->p = p;
        return 1;
    }
    const char *point = p++;
    if (p >= c->end || !is_digit(*p)) {
        return 0;
    }
    while (p < c->end && is_digit(*p)) {
        p++;
    }
    if (p < c->end && (*p == 'e' || *p == 'E')) {
        return 0;
    }
    Py_ssize_t length = p - start;
    if (length > MAX_NUMBER) {
        return 0;
    }
    char text[MAX_NUMBER + 1];
    memcpy(text, start, (size_t)length);
    text[length] = '\0';
    char *parsed_to = NULL;
    double d = PyOS_string_to_double(text, &parsed_to, NULL);
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (parsed_to != text + length || !isfinite(d) || d == floor(d)) {
        return 0; /* not all of it, too large, or integral (RFC 8785 writes it as an integer) */
    }
    /* Without repr where the text is short: a decimal of at most 15 significant digits (DBL_DIG)
     * is the only one of so few digits that reads as its double, so with no trailing zero it is
     * the double's shortest form; and repr writes it without an exponent when 1e-4 <= |d| < 1e16. */
    const char *digits = start + negative;
    Py_ssize_t significant, leading_zeros = 0;
    if (*digits == '0') {
        for (const char *q = point + 1; q < p && *q == '0'; q++) {
            leading_zeros++;
        }
        significant = (p - point - 1) - leading_zeros;
    } else {
        significant = (point - digits) + (p - point - 1);
    }
    if (significant <= 15 && p[-1] != '0' && leading_zeros <= 3) {
        *real = d;
        c->p = p;
        return 2;
    }
    char *shortest = PyOS_double_to_string(d, 'r', 0, 0, NULL);
    if (shortest == NULL) {
        PyErr_Clear();
        return 0;
    }
    int same = strcmp(shortest, text) == 0;
    PyMem_Free(shortest);
    if (!same) {
        return 0;
    }
    *real = d;
    c->p = p;
    return 2;
}

static int hex64(Cursor *c, const char **digits) {
    if (c->end - c->p < 64) {
        return 0;
    }
    for (int i = 0; i < 64; i++) {
        char ch = c->p[i];
        if (!(is_digit(ch) || (ch >= 'a' && ch <= 'f'))) {
            return 0;
        }
    }
    *digits = c->p;
    c->p += 64;
    return 1;
}

/* The data object {D} (see above). */
static int data_object(Cursor *c) {
    if (!LITERAL(c, "{")) {
        return 0;
    }
    if (LITERAL(c, "}")) {
        return 1;
    }
    const char *last_key = NULL;
    Py_ssize_t last_length = 0;
    for (;;) {
        const char *key, *key_end;
        if (!string(c, 0, &key, &key_end)) {
            return 0;
        }
        Py_ssize_t length = key_end - key;
        if (last_key != NULL) {
            Py_ssize_t common = length < last_length ? length : last_length;
            int order = memcmp(last_key, key, (size_t)common);
            if (order > 0 || (order == 0 && last_length >= length)) {
                return 0; /* not strictly after the key before */
            }
        }
        last_key = key;
        last_length = length;
        if (!LITERAL(c, ":")) {
            return 0;
        }
        if (c->p >= c->end) {
            return 0;
        }
        char ch = *c->p;
        const char *s, *e;
        long long v;
        double d;
        if (ch == '"') {
            if (!string(c, 1, &s, &e)) {
                return 0;
            }
        } else if (ch == 't') {
            if (!LITERAL(c, "true")) {
                return 0;
            }
        } else if (ch == 'f') {
            if (!LITERAL(c, "false")) {
                return 0;
            }
        } else if (ch == 'n') {
            if (!LITERAL(c, "null")) {
                return 0;
            }
        } else if (!number(c, &v, &d)) {
            return 0;
        }
        if (LITERAL(c, "}")) {
            return 1;
        }
        if (!LITERAL(c, ",")) {
            return 0;
        }
    }
}

/* A str for [start, stop) (ASCII), shared by the batch's equal ones: a new reference, or NULL. */
typedef struct {
    const char *text;
    Py_ssize_t length;
    PyObject *value;
} Cached;

static PyObject *cached_str(Cached *cache, int *used, const char *start, const char *stop) {
    Py_ssize_t length = stop - start;
    for (int i = 0; i < *used; i++) {
        if (cache[i].length == length && memcmp(cache[i].text, start, (size_t)length) == 0) {
            return Py_NewRef(cache[i].value);
        }
    }
    PyObject *value = PyUnicode_DecodeASCII(start, length, NULL);
    if (value != NULL && *used < CACHED) {
        cache[*used] = (Cached){start, length, Py_NewRef(value)};
        (*used)++;
    }
    return value;
}

static const char HEX[] = "0123456789abcdef";

/* Whether the line's hash (64 digits at hash) is the SHA-256 of the line without its hash member
 * (at key, HASH_MEMBER_LEN bytes). -1: OpenSSL failed. */
static int hashed(EVP_MD_CTX *ctx, const char *line, const char *key, const char *newline, const char *hash) {
    unsigned char digest[32];
    const char *rest = key + HASH_MEMBER_LEN;
    if (!EVP_DigestInit_ex2(ctx, sha256, NULL) || !EVP_DigestUpdate(ctx, line, (size_t)(key - line)) ||
        !EVP_DigestUpdate(ctx, rest, (size_t)(newline - rest)) || !EVP_DigestFinal_ex(ctx, digest, NULL)) {
        return -1;
    }
    for (int i = 0; i < 32; i++) {
        if (hash[2 * i] != HEX[digest[i] >> 4] || hash[2 * i + 1] != HEX[digest[i] & 15]) {
            return 0;
        }
    }
    return 1;
}

static int append_steal(PyObject *list, PyObject *value) {
    if (value == NULL) {
        return -1;
    }
    int status = PyList_Append(list, value);
    Py_DECREF(value);
    return status;
}

static PyObject *scan(PyObject *module, PyObject *arg) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) {
        return NULL;
    }
    PyObject *result = NULL, *producers = NULL, *sequences = NULL, *monotonics = NULL, *kinds = NULL;
    PyObject *spans = NULL;
    Cached producer_cache[CACHED], kind_cache[CACHED];
    int producers_cached = 0, kinds_cached = 0;
    EVP_MD_CTX *ctx = NULL;
    uint32_t *span = NULL;
    Py_ssize_t count = 0, capacity = 0;
    int refused = 0;
    long long first_seq = 0, seq = 0;
    const char *first_prev = NULL, *last_hash = NULL, *first_wall = NULL, *last_wall = NULL;
    const char *data = view.buf, *end_of_data = data + view.len;

    if (view.len == 0 || data[view.len - 1] != '\n' || (uint64_t)view.len > UINT32_MAX) {
        refused = 1; /* (check_chunk's batches are never empty, and end in a newline) */
        goto done;
    }
    ctx = EVP_MD_CTX_new();
    producers = PyList_New(0);
    sequences = PyList_New(0);
    monotonics = PyList_New(0);
    kinds = PyList_New(0);
    if (ctx == NULL || producers == NULL || sequences == NULL || monotonics == NULL || kinds == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        goto done;
    }
    for (const char *line = data; line < end_of_data; count++) {
        const char *newline = memchr(line, '\n', (size_t)(end_of_data - line));
        if (newline - line > MAX_LINE) {
            refused = 1;
            goto done;
        }
        Cursor c = {line, newline};
        const char *data_start, *data_end, *key, *hash, *kind, *kind_end, *prev, *producer, *producer_end;
        long long sequence, seq_here, integer = 0;
        double real = 0.0, unused;
        if (!LITERAL(&c, "{\"data\":")) {
            refused = 1;
            goto done;
        }
        data_start = c.p;
        if (!data_object(&c)) {
            refused = 1;
            goto done;
        }
        data_end = c.p;
        key = c.p + 1;
        if (!LITERAL(&c, ",\"hash\":\"") || !hex64(&c, &hash) || !LITERAL(&c, "\",\"kind\":") ||
            !string(&c, 0, &kind, &kind_end) || !LITERAL(&c, ",\"monotonic\":")) {
            refused = 1;
            goto done;
        }
        int kind_of_number = number(&c, &integer, &real);
        if (!kind_of_number || !LITERAL(&c, ",\"prev_hash\":\"") || !hex64(&c, &prev) ||
            !LITERAL(&c, "\",\"producer\":") || !string(&c, 0, &producer, &producer_end) ||
            !LITERAL(&c, ",\"producer_sequence\":") || number(&c, &sequence, &unused) != 1 ||
            !LITERAL(&c, ",\"schema\":\"ale-trajectory-event/v1\",\"seq\":") || number(&c, &seq_here, &unused) != 1 ||
            !LITERAL(&c, ",\"wall_time\":\"") || c.end - c.p != 27 + 2) {
            refused = 1;
            goto done;
        }
        const char *wall = c.p;
        static const char form[] = "0000-00-00T00:00:00.000000Z\"}";
        for (int i = 0; i < 29; i++) {
            if (form[i] == '0' ? !is_digit(wall[i]) : wall[i] != form[i]) {
                refused = 1;
                goto done;
            }
        }
        if (count == 0) {
            first_seq = seq = seq_here;
            first_prev = prev;
            first_wall = wall;
        } else if (seq_here != seq + 1 || memcmp(prev, last_hash, 64) != 0) {
            refused = 1;
            goto done;
        } else {
            seq = seq_here;
        }
        int ok = hashed(ctx, line, key, newline, hash);
        if (ok < 0) {
            PyErr_SetString(PyExc_RuntimeError, "OpenSSL's SHA-256 failed");
            goto done;
        }
        if (!ok) {
            refused = 1;
            goto done;
        }
        last_hash = hash;
        last_wall = wall;
        PyObject *time = kind_of_number == 1 ? PyLong_FromLongLong(integer) : PyFloat_FromDouble(real);
        if (append_steal(producers, cached_str(producer_cache, &producers_cached, producer, producer_end)) < 0 ||
            append_steal(sequences, PyLong_FromLongLong(sequence)) < 0 || append_steal(monotonics, time) < 0 ||
            append_steal(kinds, cached_str(kind_cache, &kinds_cached, kind, kind_end)) < 0) {
            goto done;
        }
        if (count >= capacity) {
            Py_ssize_t grown = capacity ? capacity * 2 : 256;
            uint32_t *bigger = PyMem_Realloc(span, (size_t)grown * 2 * sizeof(uint32_t));
            if (bigger == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            span = bigger;
            capacity = grown;
        }
        span[2 * count] = (uint32_t)(data_start - data);
        span[2 * count + 1] = (uint32_t)(data_end - data);
        line = newline + 1;
    }
    spans = PyBytes_FromStringAndSize((const char *)span, count * 2 * (Py_ssize_t)sizeof(uint32_t));
    if (spans == NULL) {
        goto done;
    }
    result = Py_BuildValue("(nLs#s#s#s#OOOOO)", count, first_seq, first_prev, (Py_ssize_t)64, last_hash,
                           (Py_ssize_t)64, first_wall, (Py_ssize_t)27, last_wall, (Py_ssize_t)27, producers, sequences,
                           monotonics, kinds, spans);
done:
    if (refused && !PyErr_Occurred()) {
        Py_CLEAR(result);
        result = Py_NewRef(Py_None);
    }
    for (int i = 0; i < producers_cached; i++) {
        Py_DECREF(producer_cache[i].value);
    }
    for (int i = 0; i < kinds_cached; i++) {
        Py_DECREF(kind_cache[i].value);
    }
    Py_XDECREF(producers);
    Py_XDECREF(sequences);
    Py_XDECREF(monotonics);
    Py_XDECREF(kinds);
    Py_XDECREF(spans);
    PyMem_Free(span);
    EVP_MD_CTX_free(ctx);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O,
     "scan(buffer, /) -> tuple | None\n--\n\n"
     "Vouch for a batch of trajectory lines of the plainest form and read what the bulk chain check\n"
     "reads of them; None if any line is not of that form (see the module's source)."},
    {NULL, NULL, 0, NULL},
};

static void free_module(void *module) {
    (void)module;
    EVP_MD_free(sha256);
    sha256 = NULL;
}

static struct PyModuleDef definition = {
    PyModuleDef_HEAD_INIT, "ale.core._eventscan", "The bulk chain check's one-pass scan of plain lines (optional).",
    -1, methods, NULL, NULL, NULL, free_module,
};

PyMODINIT_FUNC PyInit__eventscan(void) {
    if (sha256 == NULL) {
        sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
        if (sha256 == NULL) {
            PyErr_SetString(PyExc_ImportError, "OpenSSL has no SHA-256");
            return NULL;
        }
    }
    return PyModule_Create(&definition);
}
