# Warm mode of the local provider (local.mode: warm): the pool in the worker
# (src/sandbox/zygote.c, in ci_sandbox) and the zygote program it runs
# (ci-zygote, src/zygote/main.c), which embeds CPython (Debian's
# libpython3-dev, pkg-config python3-embed), with the small static program
# each warm task's init executes (ci-zygote-init, src/zygote/init.c). Without
# python3-embed ci-zygote is not built and the probe says warm mode is
# unavailable (tasks run cold).
# Neither is ever built with the sanitizers: their shadow memory would not
# fit under a task's RLIMIT_AS, and the zygote's children run Python.
pkg_check_modules(PYEMBED IMPORTED_TARGET python3-embed)

# Static: a task's init maps nothing but itself (no libc.so to load in each).
# Built with or without python3-embed: the fake zygote of the tests sits
# beside it too.
add_executable(ci-zygote-init ${S}/zygote/init.c ${S}/sandbox/child.c ${S}/sandbox/zsetup.c)
target_include_directories(ci-zygote-init PRIVATE ${S})
target_compile_options(ci-zygote-init PRIVATE -fno-sanitize=all)
target_link_options(ci-zygote-init PRIVATE -fno-sanitize=all -static)

if(PYEMBED_FOUND)
  # child.c is compiled again here: the child-side helpers ci_sandbox uses too.
  add_executable(ci-zygote ${S}/zygote/main.c ${S}/sandbox/child.c ${S}/sandbox/zsetup.c
                 ${DRIVER_C})
  target_include_directories(ci-zygote PRIVATE ${S})
  target_link_libraries(ci-zygote PRIVATE PkgConfig::PYEMBED)
  target_compile_options(ci-zygote PRIVATE -fno-sanitize=all)
  target_link_options(ci-zygote PRIVATE -fno-sanitize=all)
  # The worker looks for ci-zygote beside itself, and ci-zygote-init beside
  # ci-zygote: build them together.
  add_dependencies(ci-zygote ci-zygote-init)
  add_dependencies(ci-worker ci-zygote)
else()
  message(STATUS "python3-embed not found (libpython3-dev): ci-zygote is not built, "
                 "warm mode is unavailable")
endif()
