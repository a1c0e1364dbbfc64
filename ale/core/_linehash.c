/* ale.core._linehash: the SHA-256 of every line of a buffer with its hash member cut out.
 *
 * The verifier's bulk chain check (ale/core/trajectory.py, _bulk_hashed) hashes each line of a
 * batch without its "hash" member. In Python that is a handful of calls a line (find the member,
 * cut it out, hash, take the digest) costing about as much as the hashing itself; here it is one
 * call a batch, with the GIL released while it hashes. It does nothing else: it parses no JSON and
 * decides nothing. It computes exactly what ale.core.trajectory.body_digests_reference computes,
 * which tests/test_linehash.py holds it to over hostile buffers; the module is optional (built
 * when a C compiler and OpenSSL's headers are there; without it the reference is used).
 *
 * body_digests(buffer) -> bytes | None
 *   buffer: a bytes-like object of lines, each ending in "\n" (else ValueError).
 *   For each line L (without its "\n"): k is the offset of the LAST occurrence of '"hash":"' in
 *   L; the body is L[:k] + L[k + 8 + 66:] (the member's key, its 64 digits and '",' left out;
 *   past the end of L that part is empty). The result is the 32-byte digests of the bodies, one
 *   after another; None if any line has no '"hash":"'.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include <openssl/evp.h>

#define KEY "\"hash\":\""
#define KEY_LEN 8
#define CUT_AFTER_KEY 66 /* 64 hex digits and '",' */
#define DIGEST_LEN 32

static EVP_MD *sha256; /* fetched once, when the module is loaded */

/* The last occurrence of KEY in [start, end), or NULL. */
static const char *last_key(const char *start, const char *end) {
    if (end - start < KEY_LEN) {
        return NULL;
    }
    const char *p = end - KEY_LEN; /* the last place KEY can begin */
    while (p >= start) {
        const char *quote = memrchr(start, '"', (size_t)(p - start) + 1);
        if (quote == NULL) {
            return NULL;
        }
        if (memcmp(quote, KEY, KEY_LEN) == 0) {
            return quote;
        }
        p = quote - 1;
    }
    return NULL;
}

/* Hashes each line's body into out; 0, 1 (a line without KEY) or -1 (OpenSSL failed). Called
 * without the GIL: touches no Python object. */
static int hash_bodies(const char *data, Py_ssize_t size, unsigned char *out) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx == NULL) {
        return -1;
    }
    int status = 0;
    const char *line = data, *end_of_data = data + size;
    while (line < end_of_data) {
        const char *newline = memchr(line, '\n', (size_t)(end_of_data - line));
        /* (the caller made sure the buffer ends in a newline) */
        const char *key = last_key(line, newline);
        if (key == NULL) {
            status = 1;
            break;
        }
        const char *rest = key + KEY_LEN;
        const char *tail = (newline - rest > CUT_AFTER_KEY) ? rest + CUT_AFTER_KEY : newline;
        if (!EVP_DigestInit_ex2(ctx, sha256, NULL) || !EVP_DigestUpdate(ctx, line, (size_t)(key - line)) ||
            !EVP_DigestUpdate(ctx, tail, (size_t)(newline - tail)) || !EVP_DigestFinal_ex(ctx, out, NULL)) {
            status = -1;
            break;
        }
        out += DIGEST_LEN;
        line = newline + 1;
    }
    EVP_MD_CTX_free(ctx);
    return status;
}

static PyObject *body_digests(PyObject *module, PyObject *arg) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) {
        return NULL;
    }
    PyObject *result = NULL;
    const char *data = view.buf;
    if (view.len > 0 && data[view.len - 1] != '\n') {
        PyErr_SetString(PyExc_ValueError, "the buffer's last line does not end in a newline");
        goto done;
    }
    Py_ssize_t lines = 0;
    for (const char *p = data, *end = data + view.len; p < end; lines++) {
        p = (const char *)memchr(p, '\n', (size_t)(end - p)) + 1;
    }
    if (lines > PY_SSIZE_T_MAX / DIGEST_LEN) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, lines * DIGEST_LEN);
    if (result == NULL) {
        goto done;
    }
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = hash_bodies(data, view.len, (unsigned char *)PyBytes_AS_STRING(result));
    Py_END_ALLOW_THREADS;
    if (status != 0) {
        Py_CLEAR(result);
        if (status == 1) {
            result = Py_NewRef(Py_None);
        } else {
            PyErr_SetString(PyExc_RuntimeError, "OpenSSL's SHA-256 failed");
        }
    }
done:
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"body_digests", body_digests, METH_O,
     "body_digests(buffer, /) -> bytes | None\n--\n\n"
     "The SHA-256 digests (32 bytes each, in order) of the buffer's lines, each without its last\n"
     "'\"hash\":\"' and the 66 bytes after it; None if a line has none. Every line ends in a newline."},
    {NULL, NULL, 0, NULL},
};

static void free_module(void *module) {
    (void)module;
    EVP_MD_free(sha256);
    sha256 = NULL;
}

static struct PyModuleDef definition = {
    PyModuleDef_HEAD_INIT, "ale.core._linehash", "Per-line SHA-256 for the verifier's chain check (optional).",
    -1, methods, NULL, NULL, NULL, free_module,
};

PyMODINIT_FUNC PyInit__linehash(void) {
    if (sha256 == NULL) {
        sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
        if (sha256 == NULL) {
            PyErr_SetString(PyExc_ImportError, "OpenSSL has no SHA-256");
            return NULL;
        }
    }
    return PyModule_Create(&definition);
}
