# Pipeline stages: one object library per folder of csrc/, and the include "views" that
# make the layering a build error (docs/architecture.md, "Layering").
#
#   tcap_stage(<target> [DIR <folder>] SOURCES <files...> [DEPS <targets and libraries...>])
#
# DIR is the stage's folder under csrc/ (default: the target name without "tcap_");
# SOURCES are paths under csrc/ and must lie in that folder. DEPS names the stages (and
# other libraries) the stage builds on; only stages declared before can be named, so
# stages are declared in pipeline order.
#
# A stage's include path has no csrc/: it has its view, build/csrc/views/<target>/,
# holding a symbolic link per folder the stage may include from, its own and those of
# the stages it depends on, directly or not. `#include "fuse/fusion.h"` keeps working
# where fuse/ is below the includer, and is "No such file or directory" where it is
# not. A folder that contains another stage's folder (codegen/ holds codegen/cpu_llvm/)
# is a real directory in the view, with a link per entry except the nested stage's
# folder; its entries are globbed with CONFIGURE_DEPENDS, so a new file there re-runs
# CMake at the next build. The views are remade at every configure, after the last
# tcap_stage() of the directory (a deferred call), and described in
# build/csrc/views/stages.txt for the layering test (test/tools/layering_test.py).

set(TCAP_VIEWS_DIR ${CMAKE_BINARY_DIR}/csrc/views)

function(tcap_stage name)
  cmake_parse_arguments(S "" "DIR" "SOURCES;DEPS" ${ARGN})
  if(NOT S_DIR)
    string(REGEX REPLACE "^tcap_" "" S_DIR "${name}")
  endif()
  foreach(src IN LISTS S_SOURCES)
    if(NOT src MATCHES "^${S_DIR}/")
      message(FATAL_ERROR "tcap_stage(${name}): ${src} is not in the stage's folder csrc/${S_DIR}/")
    endif()
  endforeach()
  # The folders the stage may include from: its own, then its dependencies' (theirs
  # already hold their own dependencies').
  set(dirs ${S_DIR})
  foreach(dep IN LISTS S_DEPS)
    if(TARGET ${dep})
      get_target_property(dep_dirs ${dep} TCAP_STAGE_DIRS)
      if(dep_dirs)
        list(APPEND dirs ${dep_dirs})
      endif()
    endif()
  endforeach()
  list(REMOVE_DUPLICATES dirs)

  add_library(${name} OBJECT ${S_SOURCES})
  set_target_properties(${name} PROPERTIES TCAP_STAGE_DIR "${S_DIR}" TCAP_STAGE_DIRS "${dirs}")
  target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>)
  target_include_directories(${name} PRIVATE ${TCAP_VIEWS_DIR}/${name})
  target_link_libraries(${name} PUBLIC torch ${S_DEPS})
  target_compile_definitions(${name} PRIVATE TCAP_BUILDING_LIBRARY)
  tcap_warnings(${name})

  set_property(GLOBAL APPEND PROPERTY TCAP_STAGES ${name})
  get_property(deferred GLOBAL PROPERTY TCAP_STAGE_VIEWS_DEFERRED)
  if(NOT deferred)
    set_property(GLOBAL PROPERTY TCAP_STAGE_VIEWS_DEFERRED TRUE)
    cmake_language(DEFER DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR} CALL _tcap_make_stage_views)
  endif()
endfunction()

# view/<dir> for one allowed folder: a link to csrc/<dir>, or, when other stages' folders
# lie inside it, a directory of links to its entries minus those folders.
function(_tcap_view_folder view dir stage_dirs)
  set(nested FALSE)
  foreach(other IN LISTS stage_dirs)
    if(other MATCHES "^${dir}/")
      set(nested TRUE)
    endif()
  endforeach()
  get_filename_component(parent ${view}/${dir} DIRECTORY)
  file(MAKE_DIRECTORY ${parent})
  if(NOT nested)
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/csrc/${dir} ${view}/${dir} SYMBOLIC)
    return()
  endif()
  file(MAKE_DIRECTORY ${view}/${dir})
  file(GLOB entries LIST_DIRECTORIES true RELATIVE ${PROJECT_SOURCE_DIR}/csrc/${dir} CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/csrc/${dir}/*)
  foreach(entry IN LISTS entries)
    if(NOT "${dir}/${entry}" IN_LIST stage_dirs)
      _tcap_view_folder(${view} ${dir}/${entry} "${stage_dirs}")
    endif()
  endforeach()
endfunction()

function(_tcap_make_stage_views)
  get_property(stages GLOBAL PROPERTY TCAP_STAGES)
  set(stage_dirs)
  foreach(stage IN LISTS stages)
    get_target_property(dir ${stage} TCAP_STAGE_DIR)
    list(APPEND stage_dirs ${dir})
  endforeach()
  file(REMOVE_RECURSE ${TCAP_VIEWS_DIR})
  set(manifest "# stage|folder|folders it may include from|one of its sources (written by cmake/TcapStages.cmake)\n")
  foreach(stage IN LISTS stages)
    get_target_property(dir ${stage} TCAP_STAGE_DIR)
    get_target_property(dirs ${stage} TCAP_STAGE_DIRS)
    get_target_property(sources ${stage} SOURCES)
    list(GET sources 0 first)
    foreach(allowed IN LISTS dirs)
      _tcap_view_folder(${TCAP_VIEWS_DIR}/${stage} ${allowed} "${stage_dirs}")
    endforeach()
    string(REPLACE ";" "," dirs_csv "${dirs}")
    string(APPEND manifest "${stage}|${dir}|${dirs_csv}|${CMAKE_CURRENT_SOURCE_DIR}/${first}\n")
  endforeach()
  file(WRITE ${TCAP_VIEWS_DIR}/stages.txt "${manifest}")
endfunction()
