# Warm mode of the local provider (local.mode: warm): the pool in the worker
# (src/sandbox/zygote.c, in ci_sandbox) and the zygote program it runs
# (ci-zygote, src/zygote/main.c), which embeds CPython (Debian's
# libpython3-dev, pkg-config python3-embed). Without python3-embed ci-zygote
# is not built and the probe says warm mode is unavailable (tasks run cold).
# ci-zygote is never built with the sanitizers: their shadow memory would not
# fit under a task's RLIMIT_AS, and the zygote's children run Python.
pkg_check_modules(PYEMBED IMPORTED_TARGET python3-embed)

if(PYEMBED_FOUND)
  # child.c is compiled again here: the child-side helpers ci_sandbox uses too.
  add_executable(ci-zygote ${S}/zygote/main.c ${S}/sandbox/child.c ${DRIVER_C})
  target_include_directories(ci-zygote PRIVATE ${S})
  target_link_libraries(ci-zygote PRIVATE PkgConfig::PYEMBED)
  target_compile_options(ci-zygote PRIVATE -fno-sanitize=all)
  target_link_options(ci-zygote PRIVATE -fno-sanitize=all)
  # The worker looks for ci-zygote beside itself: build them together.
  add_dependencies(ci-worker ci-zygote)
else()
  message(STATUS "python3-embed not found (libpython3-dev): ci-zygote is not built, "
                 "warm mode is unavailable")
endif()
