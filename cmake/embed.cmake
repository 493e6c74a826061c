# Writes the file IN as a C string constant NAME (with NAME_len) into OUT.
file(READ ${IN} content HEX)
string(LENGTH "${content}" hexlen)
math(EXPR len "${hexlen} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${content}")
file(WRITE ${OUT} "/* generated from ${IN} */\n#include <stddef.h>\n"
     "const char ${NAME}[] = {${bytes} 0x00};\nconst size_t ${NAME}_len = ${len};\n")
