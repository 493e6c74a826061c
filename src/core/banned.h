/* banned.h - C library functions our code must not call, poisoned so that
 * a call is a compile error (curl's checksrc bans them by script, git's
 * banned.h by macro). The build force-includes this header first into every
 * C file of ours (-include, CMakeLists.txt), not into generated code. It
 * includes the headers that declare these functions before it poisons
 * them, so their declarations are seen first and the sources' own
 * #include <stdio.h> and the like are no-ops by then.
 *
 * Why each, and what to use instead:
 *   sprintf vsprintf       no bound on the output: snprintf, ci_buf_appendf
 *   strcpy strcat strncpy  unbounded, or silently unterminated: snprintf, memcpy
 *   strncat                its bound is what is left, an easy off-by-one: snprintf
 *   atoi atol atoll atof   no error, undefined on overflow: strtol and friends
 *   strtok                 hidden global state: strtok_r, strcspn
 *   system popen           a shell between us and the command: fork + execve
 *   gets                   no bound at all: fgets
 *   tmpnam tempnam mktemp  racy names: mkstemp, mkdtemp, O_TMPFILE
 */
#ifndef CI_BANNED_H
#define CI_BANNED_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Some are macros by now (glibc's _FORTIFY_SOURCE under clang makes
 * sprintf one), and poisoning a macro is an error of its own. */
#undef sprintf
#undef vsprintf
#undef strcpy
#undef strcat
#undef strncpy
#undef strncat
#undef atoi
#undef atol
#undef atoll
#undef atof
#undef strtok
#undef system
#undef popen
#undef gets
#undef tmpnam
#undef tempnam
#undef mktemp

#pragma GCC poison sprintf vsprintf strcpy strcat strncpy strncat
#pragma GCC poison atoi atol atoll atof strtok
#pragma GCC poison system popen gets tmpnam tempnam mktemp

#endif
