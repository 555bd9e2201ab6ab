# embed.cmake: one text file as a NUL-terminated C char array (cedar view's
# page assets, viz/view.js and viz/view.css; CMakeLists.txt runs it):
#   cmake -DIN=viz/view.js -DOUT=build/viz_view_js.c -DNAME=viz_view_js -P viz/embed.cmake
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," hex "${hex}")
file(WRITE "${OUT}" "/* generated from ${IN} by viz/embed.cmake; do not edit */\nconst char ${NAME}[] = {${hex}0x00};\n")
