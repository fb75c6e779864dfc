# dsv4_module(name DEPS ...): src/<name>/*.cpp -> static library dsv4_<name>
# (an INTERFACE library while the module has no .cpp files yet).
function(dsv4_module name)
  cmake_parse_arguments(M "" "" "DEPS" ${ARGN})
  file(GLOB srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${name}/*.cpp)
  if(srcs)
    add_library(dsv4_${name} STATIC ${srcs})
    target_include_directories(dsv4_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(dsv4_${name} PUBLIC ${M_DEPS})
  else()
    add_library(dsv4_${name} INTERFACE)
    target_include_directories(dsv4_${name} INTERFACE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(dsv4_${name} INTERFACE ${M_DEPS})
  endif()
endfunction()

# dsv4_tests(name): tests/<name>/*.cpp -> one GoogleTest program test_<name>, registered with CTest.
# Tests find their data through DSV4_SOURCE_DIR and the built CLI through DSV4_BINARY (compile definitions);
# shared helpers live in tests/common/ (header-only).
function(dsv4_tests name)
  file(GLOB srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/${name}/*.cpp)
  if(NOT srcs)
    return()
  endif()
  add_executable(test_${name} ${srcs})
  target_include_directories(test_${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  # tests/cli drives the built program; the other suites link their module only, so that each builds alone.
  if(name STREQUAL "cli")
    target_link_libraries(test_${name} PRIVATE dsv4_server GTest::gtest GTest::gtest_main GTest::gmock)
    add_dependencies(test_${name} dsv4)
  else()
    target_link_libraries(test_${name} PRIVATE dsv4_${name} GTest::gtest GTest::gtest_main GTest::gmock)
  endif()
  target_compile_definitions(test_${name} PRIVATE
    DSV4_SOURCE_DIR="${PROJECT_SOURCE_DIR}" DSV4_BINARY="${PROJECT_BINARY_DIR}/dsv4")
  gtest_discover_tests(test_${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS ${name})
endfunction()
