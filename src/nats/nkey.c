/* nkey.c - the public key of an NKey seed, as text or in a seed file
 * (nkey.h): base32 and CRC-16 of the NKey encoding, Ed25519 from libcrypto. */
#include "nats/nkey.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"

#define SEED_CHARS 58
#define PUB_CHARS 56
#define PREFIX_SEED (18 << 3) /* 'S' */

static const char b32[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/* CRC-16/XMODEM, as NKeys append it (little-endian). */
static uint16_t crc16(const uint8_t *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

static size_t base32_decode(const char *in, size_t n, uint8_t *out, size_t cap)
{
    uint32_t acc = 0;
    int bits = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = strchr(b32, in[i]);
        if (!p || !in[i])
            return 0;
        acc = (acc << 5) | (uint32_t)(p - b32);
        bits += 5;
        if (bits >= 8) {
            if (o == cap)
                return 0;
            out[o++] = (uint8_t)(acc >> (bits - 8));
            bits -= 8;
        }
    }
    return o;
}

static void base32_encode(const uint8_t *in, size_t n, char *out)
{
    uint32_t acc = 0;
    int bits = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        acc = (acc << 8) | in[i];
        bits += 8;
        while (bits >= 5) {
            out[o++] = b32[(acc >> (bits - 5)) & 31];
            bits -= 5;
        }
    }
    if (bits > 0)
        out[o++] = b32[(acc << (5 - bits)) & 31];
    out[o] = '\0';
}

ci_status ci_nkey_public_from_seed(const char *seed, size_t len, char out[57],
                                   struct ci_error *err)
{
    uint8_t raw[36];
    if (len != SEED_CHARS || base32_decode(seed, len, raw, sizeof(raw)) != sizeof(raw))
        return ci_error_set(err, CI_ERR_INVALID, "not an NKey seed");
    uint16_t want = (uint16_t)(raw[34] | raw[35] << 8);
    if (crc16(raw, 34) != want)
        return ci_error_set(err, CI_ERR_INVALID, "the NKey seed's checksum is wrong");
    if ((raw[0] & 0xF8) != PREFIX_SEED)
        return ci_error_set(err, CI_ERR_INVALID, "not an NKey seed (it must start with 'S')");
    uint8_t kind = (uint8_t)(((raw[0] & 7) << 5) | ((raw[1] & 0xF8) >> 3));

    EVP_PKEY *key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, raw + 2, 32);
    uint8_t pub[35];
    size_t publen = 32;
    if (!key || EVP_PKEY_get_raw_public_key(key, pub + 1, &publen) != 1 || publen != 32) {
        EVP_PKEY_free(key);
        return ci_error_set(err, CI_ERR_INVALID, "the NKey seed is not a valid Ed25519 key");
    }
    EVP_PKEY_free(key);
    pub[0] = kind;
    uint16_t c = crc16(pub, 33);
    pub[33] = (uint8_t)(c & 0xFF);
    pub[34] = (uint8_t)(c >> 8);
    base32_encode(pub, sizeof(pub), out);
    return CI_OK;
}

ci_status ci_nkey_public_from_seed_file(const char *seed_file, char out[57],
                                        struct ci_error *err)
{
    char buf[4096];
    CI_AUTOCLOSE int fd = open(seed_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ci_error_errno(err, CI_ERR_IO, errno, "cannot open NKey seed file '%s'", seed_file);
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n < 0)
        return ci_error_errno(err, CI_ERR_IO, errno, "cannot read NKey seed file '%s'", seed_file);
    buf[n] = '\0';
    /* The first run of base32 characters that starts with 'S'. */
    for (char *p = buf; *p; p++) {
        if (*p != 'S' || (p > buf && strchr(b32, p[-1])))
            continue;
        size_t len = strspn(p, b32);
        ci_status s = ci_nkey_public_from_seed(p, len, out, NULL);
        explicit_bzero(buf, sizeof(buf));
        if (s == CI_OK)
            return CI_OK;
        break;
    }
    explicit_bzero(buf, sizeof(buf));
    return ci_error_set(err, CI_ERR_INVALID, "NKey seed file '%s' holds no valid seed", seed_file);
}
